"""MatrixMultiply and MLP: batched GEMMs captured in CUDA graphs, either cuBLAS (our own handle) with bias, residual
and activation applied by one in-place epilogue kernel, or cuBLASLt (cublaslt.py) with bias and tanh GELU (in fp16
also the erf GELU, as the tanh form) in its epilogue and the residual as its C operand (other activations, ReLU
among them, still take the epilogue kernel). Both are candidates: the tactic timer keeps the faster.
``TFTRT_PY_GEMM=cublas`` or ``cublaslt`` keeps only that one (tests)."""
from __future__ import annotations

import itertools
import logging
from typing import List, Optional, Tuple

import numpy as np

from tftrt_py import settings
from tftrt_py.engine.backends.cupy import _device, cublaslt
from tftrt_py.engine.backends.cupy.context import CUBLAS_WORKSPACE
from tftrt_py.engine.backends.cupy.ops.base import Op, Spec, align, quantized_candidates, register
from tftrt_py.engine.backends.cupy.ops.pointwise import epilogue_op

__all__ = ["MatMulOp", "LtMatMulOp", "MLPOp", "LtMLPOp", "gemm_paths", "LT_ALGOS", "MLP_COMBINATIONS"]

logger = logging.getLogger(__name__)

#: cuBLASLt algorithms (heuristics order) offered as candidates of one GEMM: BERT's FFN expansion at 4096 rows was
#: fastest with the seventh (34 against 37 us for the first, H100).
LT_ALGOS = 8
#: At most this many algorithm combinations are timed for one MLP layer (each of its GEMMs picks its own).
MLP_COMBINATIONS = 64


def gemm_paths(prefer: Optional[dict], cublas_op: str, lt_op: str) -> tuple:
    """(build the cuBLAS op, build the cuBLASLt ops): what a recorded tactic and TFTRT_PY_GEMM allow."""
    force = settings.GEMM.get()
    op = (prefer or {}).get("op")
    lt = force in (None, "cublaslt") and op in (None, lt_op) and cublaslt.available()  # (imports nvmath: last)
    return force in (None, "cublas") and op in (None, cublas_op), lt


def _lt_epilogue(has_bias: bool, activation, dtype: str) -> tuple:
    """(cuBLASLt epilogue, whether it also adds the bias and applies the activation)."""
    fused = cublaslt.fused_epilogue(has_bias, activation, dtype)
    return (fused, True) if fused is not None else ("DEFAULT", False)


class MatMulOp(Op):
    """np.matmul with transposes; operands whose batch only partly broadcasts are expanded first."""

    def __init__(self, spec: Spec):
        cupy = _device.require()
        p = spec.params
        self.dtype = spec.cdt
        self.allow_tf32 = spec.options.allow_tf32
        (sa, sb), out = spec.in_shapes[:2], spec.out_shapes[0]
        self.ta, self.tb = bool(p.get("transpose_a")), bool(p.get("transpose_b"))
        self.m, self.n = out[-2], out[-1]
        self.k = sa[-2] if self.ta else sa[-1]
        self.lda, self.ldb = sa[-1], sb[-1]
        batch = tuple(out[:-2])
        self.batch = int(np.prod(batch)) if batch else 1
        self.expand = []  # (operand index, full shape, workspace offset)
        offset = 0
        self.strides = []
        for i, shape in enumerate((sa, sb)):
            own = tuple(shape[:-2])
            size = int(np.prod(shape[-2:]))
            if int(np.prod(own or (1,))) == 1:
                self.strides.append(0)
            elif (1,) * (len(batch) - len(own)) + own == batch:
                self.strides.append(size)
            else:
                full = batch + tuple(shape[-2:])
                self.expand.append((i, full, offset))
                offset += align(int(np.prod(full)) * np.dtype(self.dtype).itemsize)
                self.strides.append(size)
        self.workspace = offset
        self.bias_np = spec.weights.get("bias")
        self.activation = p.get("activation")
        self.residual = len(spec.in_shapes) > 2  # the third input, added before the activation
        self.bias = cupy.asarray(self.bias_np.astype(np.float32)) if self.bias_np is not None else None
        self.epilogue = epilogue_op(self.dtype, self.bias is not None, self.residual, self.activation,
                                    spec.out_shapes[0], spec.in_shapes[2] if self.residual else None) if (
            self.bias is not None or self.activation or self.residual) else None
        self.device_bytes = int(self.bias.nbytes) if self.bias is not None else 0
        self.tactic = {"op": "cublas_gemm", "expand": len(self.expand), "workspace": self.workspace}

    def run(self, rc, ins, outs):
        cupy = _device.require()
        ptrs = [ins[0].data.ptr, ins[1].data.ptr]
        for i, full, offset in self.expand:
            view = rc.scratch(offset, full, self.dtype)
            cupy.copyto(view, cupy.broadcast_to(ins[i], full))
            ptrs[i] = view.data.ptr
        y = outs[0]
        self._gemm(rc, ptrs[0], ptrs[1], y.data.ptr, ins[2].data.ptr if self.residual else None)
        if self.epilogue is not None:
            self.epilogue(*([self.bias] if self.bias is not None else []), *ins[2:], y)

    def _gemm(self, rc, a: int, b: int, y: int, residual: Optional[int]) -> None:
        rc.cublas.gemm(self.dtype, self.m, self.n, self.k, a, self.lda, self.ta, b, self.ldb, self.tb, y, self.n,
                       batch=self.batch, stride_a=self.strides[0], stride_b=self.strides[1],
                       stride_c=self.m * self.n, allow_tf32=self.allow_tf32)


class LtMatMulOp(MatMulOp):
    """The same product through one cuBLASLt algorithm of `plan`; a single (unbatched) product takes bias
    and activation in cuBLASLt's epilogue where it has them (the bias then in the output's dtype), and its
    residual as C (D = AB + C, beta 1)."""

    def __init__(self, spec: Spec, plan: cublaslt.LtGemm, algo: int, fused: bool):
        super().__init__(spec)
        self.plan, self.algo = plan, algo
        if fused:
            self.epilogue = self.bias = None
            self.device_bytes = int(plan.bias.nbytes) if plan.bias is not None else 0
        self.tactic = {"op": "cublaslt_gemm", "plan": algo, "epilogue": plan.epilogue, "expand": len(self.expand),
                       "workspace": self.workspace}

    def _gemm(self, rc, a: int, b: int, y: int, residual: Optional[int]) -> None:
        ws = rc.cublas
        self.plan.run(self.algo, a, b, y, ws.workspace_ptr, ws.workspace_bytes, rc.stream.ptr,
                      c=residual if self.plan.residual else None)


def _lt_matmul_ops(spec: Spec, base: MatMulOp) -> List[Op]:
    cupy = _device.require()
    epilogue, fused = ("DEFAULT", False)
    if base.batch == 1:
        epilogue, fused = _lt_epilogue(base.bias_np is not None, base.activation, base.dtype)
    bias = cupy.asarray(base.bias_np.astype(base.dtype)) if fused and base.bias_np is not None else None
    plan = cublaslt.LtGemm(base.m, base.n, base.k, base.dtype, trans_a=base.ta, trans_b=base.tb, lda=base.lda,
                           ldb=base.ldb, batch=base.batch, stride_a=base.strides[0], stride_b=base.strides[1],
                           epilogue=epilogue, bias=bias, residual=fused and base.residual, allow_tf32=base.allow_tf32,
                           max_workspace=CUBLAS_WORKSPACE, algos=LT_ALGOS)
    want = (spec.prefer or {}).get("plan")
    return [LtMatMulOp(spec, plan, i, fused) for i in range(len(plan.algos)) if want in (None, i)]


class MLPOp(Op):
    """Chained GEMM + bias + activation; intermediates ping-pong in the workspace; the residual (second input, if
    any) is added in the last GEMM's epilogue."""

    def __init__(self, spec: Spec):
        cupy = _device.require()
        self.dtype = spec.cdt
        self.allow_tf32 = spec.options.allow_tf32
        self.rows = spec.in_shapes[0][0]
        self.acts = spec.params["activations"]
        self.residual = len(spec.in_shapes) > 1
        self.layers = []
        for i, act in enumerate(self.acts):
            w = spec.weights[f"w{i}"]
            residual = self.residual and i == len(self.acts) - 1
            bias = cupy.asarray(spec.weights[f"b{i}"].astype(np.float32))
            self.layers.append((cupy.asarray(w.astype(self.dtype)), bias, epilogue_op(self.dtype, True, residual, act),
                                w.shape[0], w.shape[1]))
        widest = max([n for *_, n in self.layers[:-1]] or [0])
        self.half = align(self.rows * widest * np.dtype(self.dtype).itemsize)
        self.workspace = 2 * self.half if len(self.layers) > 1 else 0
        self.device_bytes = sum(int(w.nbytes) + int(b.nbytes) for w, b, *_ in self.layers)
        self.tactic = {"op": "cublas_mlp", "layers": len(self.layers)}

    def run(self, rc, ins, outs):
        x = ins[0]
        last = len(self.layers) - 1
        for i, (w, b, epilogue, k, n) in enumerate(self.layers):
            y = outs[0] if i == last else rc.scratch((i % 2) * self.half, (self.rows, n), self.dtype)
            residual = ins[1:] if i == last else []
            self._gemm(rc, i, x.data.ptr, y.data.ptr, residual[0].data.ptr if residual else None)
            if epilogue is not None:
                epilogue(*([b] if b is not None else []), *residual, y)
            x = y

    def _gemm(self, rc, i: int, x: int, y: int, residual: Optional[int]) -> None:
        w, _, _, k, n = self.layers[i]
        rc.cublas.gemm(self.dtype, self.rows, n, k, x, k, False, w.data.ptr, n, False, y, n,
                       allow_tf32=self.allow_tf32)


class LtMLPOp(MLPOp):
    """The same chain through cuBLASLt, bias and activation in the epilogue where cuBLASLt has them, and then the
    residual as the last GEMM's C; GEMM i runs heuristic algorithm `algos[i]` of its plan. `like`: another
    combination over the same plans and weights."""

    def __init__(self, spec: Spec, algos: Optional[Tuple[int, ...]] = None, like: Optional["LtMLPOp"] = None):
        if like is not None:
            self.__dict__.update(like.__dict__)
        else:
            self._build(spec)
        self.algos = tuple(algos) if algos is not None else (0,) * len(self.plans)
        self.tactic = {"op": "cublaslt_mlp", "plan": list(self.algos), "layers": len(self.layers),
                       "epilogues": [p.epilogue for p in self.plans]}

    def _build(self, spec: Spec) -> None:
        super().__init__(spec)
        cupy = _device.require()
        self.plans = []
        for i, (w, b, epilogue, k, n) in enumerate(self.layers):
            name, fused = _lt_epilogue(True, self.acts[i], self.dtype)
            bias = cupy.asarray(spec.weights[f"b{i}"].astype(self.dtype)) if fused else None
            residual = fused and self.residual and i == len(self.layers) - 1
            self.plans.append(cublaslt.LtGemm(self.rows, n, k, self.dtype, epilogue=name, bias=bias, residual=residual,
                                              allow_tf32=self.allow_tf32, max_workspace=CUBLAS_WORKSPACE,
                                              algos=LT_ALGOS))
            if fused:
                self.layers[i] = (w, None, None, k, n)
        self.device_bytes = sum(int(w.nbytes) + (int(b.nbytes) if b is not None else 0) for w, b, *_ in self.layers)
        self.device_bytes += sum(int(p.bias.nbytes) for p in self.plans if p.bias is not None)

    def _gemm(self, rc, i: int, x: int, y: int, residual: Optional[int]) -> None:
        ws = rc.cublas
        plan = self.plans[i]
        plan.run(self.algos[i], x, self.layers[i][0].data.ptr, y, ws.workspace_ptr, ws.workspace_bytes,
                 rc.stream.ptr, c=residual if plan.residual else None)


def _lt_mlp_ops(spec: Spec) -> List[Op]:
    """One op per combination of the GEMMs' algorithms: each GEMM's first k, k^layers <= MLP_COMBINATIONS."""
    first = LtMLPOp(spec)
    per_gemm = max(1, int(MLP_COMBINATIONS ** (1 / len(first.plans)) + 1e-9))
    combos = itertools.product(*(range(min(per_gemm, len(p.algos))) for p in first.plans))
    want = (spec.prefer or {}).get("plan")
    return [first if c == first.algos else LtMLPOp(spec, c, first) for c in combos if want in (None, list(c))]


def _lt_or_skip(what: str, build) -> List[Op]:
    """`build()`'s cuBLASLt ops, or none where cuBLASLt refuses this product (logged)."""
    try:
        return build()
    except Exception as exc:
        logger.debug("no cuBLASLt candidate for %s: %s", what, exc)
        return []


@register("MatrixMultiply")
def matmul_candidates(spec: Spec) -> List[Op]:
    if spec.quant is not None:  # an INT8 or FP8 layer
        return quantized_candidates(spec)
    base = MatMulOp(spec)
    want_cublas, want_lt = gemm_paths(spec.prefer, "cublas_gemm", "cublaslt_gemm")
    lt = _lt_or_skip(spec.layer.name, lambda: _lt_matmul_ops(spec, base)) if want_lt else []
    return ([base] if want_cublas or not lt else []) + lt


@register("MLP")
def mlp_candidates(spec: Spec) -> List[Op]:
    want_cublas, want_lt = gemm_paths(spec.prefer, "cublas_mlp", "cublaslt_mlp")
    lt = _lt_or_skip(spec.layer.name, lambda: _lt_mlp_ops(spec)) if want_lt else []
    return ([MLPOp(spec)] if want_cublas or not lt else []) + lt
