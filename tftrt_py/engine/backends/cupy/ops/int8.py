"""INT8 Convolution and MatrixMultiply: int8 x int8 products accumulated in int32 (cuDNN int8 graphs, our Triton
kernel, cuBLAS or cuBLASLt int8 GEMMs with both operands K-contiguous), dequantized, biased, summed and activated in
fp32 (the contract and the quantize step: ops/quant.py). Registered for (kind, "INT8"); fp8.py builds its cuDNN
graphs and cuBLASLt GEMMs from these with E4M3 operands.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import threading
from typing import List, Optional, Tuple

import numpy as np

from tftrt_py import settings
from tftrt_py.engine.backends.cupy import _device, cublaslt, kernels
from tftrt_py.engine.backends.cupy.context import CUBLAS_WORKSPACE
from tftrt_py.engine.backends.cupy.ops import conv_fold
from tftrt_py.engine.backends.cupy.ops.base import Op, Spec, align, register
from tftrt_py.engine.backends.cupy.ops.conv import (CudnnConvGraph, ConvGeom, _cudnn_activation, cudnn_graph_cache,
                                                    im2col_kernel, nhwc_dims)
from tftrt_py.engine.backends.cupy.ops.matmul import gemm_paths
from tftrt_py.engine.backends.cupy.ops.quant import (INT8, PAD, Dequant, QuantizeAfterOp, QuantizeOp, matmul_dequant,
                                                     out_scale, padded)
from tftrt_py.engine.backends.cupy.ops.triton_conv import (OPERANDS, ConvOperands, triton_conv_candidates,
                                                           triton_matmul_candidates)
from tftrt_py.engine.quantization import FORMATS, QMAX, quantize_per_channel

__all__ = ["INT8_FUSIONS", "DUAL_FUSIONS", "quantize_weights", "CudnnInt8ConvGraph", "CudnnInt8ConvOp",
           "GemmInt8ConvOp", "int8_conv_candidates", "Int8MatMulOp", "LtInt8MatMulOp", "int8_matmul_candidates",
           "matmul_constant"]

logger = logging.getLogger(__name__)


def quantize_weights(w: np.ndarray, axis: int = -1) -> Tuple[np.ndarray, np.ndarray]:
    """(int8 weights, float32 scale per index of `axis`): s = max|w| over the other axes / 127 (1 where
    that is 0), computed in float64."""
    q, s = quantize_per_channel(w, axis, FORMATS["INT8"])
    return q.astype(np.int8), s.reshape(-1).astype(np.float32)


# -- cuDNN int8 convolution ---------------------------------------------------------------------------
#: Graph variants, most fused first: "fused" dequantizes, adds bias and residual, activates (and rounds
#: to fp16 and requantizes) inside cuDNN; "fused_i32" is the same with the accumulator typed int32;
#: "fused_nr" (int8 outputs only) requantizes without the fp16 rounding (about 0.2% of the int8 values
#: then differ by one step from the numpy backend's); "conv" writes the int32 accumulators and an
#: epilogue kernel does the rest. With a second (int8) output, "fused+q" and "fused_nr+q" write both
#: from the graph, and the single-output graphs are followed by a quantize kernel.
INT8_FUSIONS = ("fused", "fused_i32", "fused_nr", "conv")
DUAL_FUSIONS = ("fused+q", "fused_nr+q")


class CudnnInt8ConvGraph(CudnnConvGraph):
    """A cuDNN int8 convolution graph (NHWC, int8 image and filter, int32 accumulation)."""

    def __init__(self, geom: ConvGeom, fusion: str, bias: bool, residual: Optional[Tuple[int, str]], activation,
                 out_dtype: str, max_workspace: int, handle, fp8: bool = False):
        dual = fusion.endswith("+q")
        cudnn = _device.cudnn_module()
        dt = cudnn.data_type
        qt, acc = (dt.FP8_E4M3, dt.FLOAT) if fp8 else (dt.INT8, dt.INT32)  # FP8: E4M3 operands, fp32 sums
        self.lock = threading.Lock()
        self.fusion, self.dtype = fusion, out_dtype
        io = {"float16": dt.HALF, "float32": dt.FLOAT, "int8": dt.INT8}
        g2 = geom.as2d()
        inter = acc if fusion == "conv" else dt.FLOAT
        g = cudnn.pygraph(io_data_type=qt, intermediate_data_type=inter, compute_data_type=inter, handle=handle)
        xd, xs = nhwc_dims(g2.n, g2.c, g2.spatial)
        wd, ws = nhwc_dims(g2.cout, g2.cg, g2.kernel)
        vd, vs = nhwc_dims(1, g2.cout, [1] * len(g2.spatial))
        self.X = g.tensor(name="X", dim=xd, stride=xs, data_type=qt)
        self.W = g.tensor(name="W", dim=wd, stride=ws, data_type=qt)
        y = g.conv_fprop(image=self.X, weight=self.W, pre_padding=list(g2.pre), post_padding=list(g2.post),
                         stride=list(g2.strides), dilation=list(g2.dilations), compute_data_type=acc,
                         name="conv")
        self.S = self.B = self.R = self.Q = self.H = self.Yq = None
        yd, ys = nhwc_dims(g2.n, g2.cout, g2.out)
        if fusion == "conv":
            y = g.identity(input=y, name="identity", compute_data_type=acc)
            y.set_output(True).set_data_type(acc).set_dim(yd).set_stride(ys)
        else:
            if fusion == "fused_i32":
                y.set_data_type(dt.INT32)
            f32 = dt.FLOAT
            self.S = g.tensor(name="S", dim=vd, stride=vs, data_type=f32)
            y = g.mul(a=y, b=self.S, name="dequant", compute_data_type=f32)
            if bias:
                self.B = g.tensor(name="B", dim=vd, stride=vs, data_type=f32)
                y = g.add(a=y, b=self.B, name="bias", compute_data_type=f32)
            if residual is not None:
                rn, rdtype = residual
                rd, rs = nhwc_dims(rn, g2.cout, g2.out)
                self.R = g.tensor(name="R", dim=rd, stride=rs, data_type=io[rdtype])
                y = g.add(a=y, b=self.R, name="residual", compute_data_type=f32)
            if activation:
                y = _cudnn_activation(g, y, activation)
            if out_dtype == "int8" or dual:  # q = clamp(floor(fp16(y) / s + 0.5), -127, 127): integers, then int8
                q = y
                if not fusion.startswith("fused_nr"):
                    q = g.identity(input=q, name="fp16", compute_data_type=f32)
                    q.set_data_type(dt.HALF)
                self.Q = g.tensor(name="Q", dim=vd, stride=vs, data_type=f32)
                self.H = g.tensor(name="H", dim=vd, stride=vs, data_type=f32)
                q = g.mul(a=q, b=self.Q, name="requant", compute_data_type=f32)
                q = g.add(a=q, b=self.H, name="half", compute_data_type=f32)
                q = g.floor(input=q, name="round", compute_data_type=f32)
                q = g.relu(input=q, lower_clip=-float(QMAX), upper_clip=float(QMAX), name="clamp",
                           compute_data_type=f32)
                if dual:
                    q.set_output(True).set_data_type(dt.INT8).set_dim(yd).set_stride(ys)
                    self.Yq = q
                else:
                    y = q
            y.set_output(True).set_data_type(io[out_dtype]).set_dim(yd).set_stride(ys)
        self.Y = y
        g.validate()
        g.build_operation_graph()
        notes = [getattr(cudnn.behavior_note, n) for n in ("REQUIRES_FILTER_INT8x32_REORDER",
                                                           "REQUIRES_BIAS_INT8x32_REORDER")
                 if hasattr(cudnn.behavior_note, n)]
        if notes:
            g.deselect_behavior_notes(notes)
        g.deselect_workspace_greater_than(int(max_workspace))
        g.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
        g.check_support()
        self._adopt(g, handle)


class CudnnInt8ConvOp(Op):
    """One plan of a cuDNN int8 convolution graph; with fusion "conv" an epilogue kernel dequantizes."""

    uses_cudnn = True

    def __init__(self, graph: CudnnInt8ConvGraph, plan, w, deq: Dequant, acc_shape, has_residual: bool):
        self.graph, (self.index, name, self.plan_workspace) = graph, plan
        self.w, self.deq, self.has_residual = w, deq, has_residual
        self.acc_shape = acc_shape
        self.acc_bytes = align(int(np.prod(acc_shape)) * 4) if graph.fusion == "conv" else 0
        self.workspace = self.acc_bytes + self.plan_workspace
        cupy = _device.require()
        self.q = self.half = None
        if graph.Q is not None:
            cout = int(deq.dq.shape[-1])
            self.q = cupy.full((cout,), np.float32(1.0) / deq.requant_scale, cupy.float32)
            self.half = cupy.full((cout,), 0.5, cupy.float32)
        self.device_bytes = int(w.nbytes) + deq.nbytes
        self.tactic = {"op": "cudnn_conv_int8", "fusion": graph.fusion, "plan": name, "workspace": self.workspace}

    def run(self, rc, ins, outs):
        g = self.graph
        ws_ptr = rc.workspace_ptr + self.acc_bytes
        pack = {g.X: ins[0].data.ptr, g.W: self.w.data.ptr}
        if g.fusion == "conv":
            acc = rc.scratch(0, self.acc_shape, self.deq.acc_dtype)
            pack[g.Y] = acc.data.ptr
        else:
            pack[g.Y] = outs[0].data.ptr
            pack[g.S] = self.deq.dq.data.ptr
            if g.B is not None:
                pack[g.B] = self.deq.bias.data.ptr
            if g.R is not None:
                pack[g.R] = ins[1].data.ptr
            if g.Q is not None:
                pack[g.Q] = self.q.data.ptr
                pack[g.H] = self.half.data.ptr
            if g.Yq is not None:
                pack[g.Yq] = outs[1].data.ptr
        g.execute(self.index, pack, ws_ptr if self.plan_workspace else None, rc.cudnn)
        if g.fusion == "conv":
            self.deq.run(acc, ins[1] if self.has_residual else None, outs[0], outs[1] if len(outs) > 1 else None)


def _cudnn_int8_graph(geom, fusion, bias, residual, activation, out_dtype, opts, fp8: bool = False
                      ) -> CudnnInt8ConvGraph:
    key = json.dumps(["fp8" if fp8 else "int8", dataclasses.astuple(geom), fusion, bias, residual, activation,
                      out_dtype, opts.max_workspace, _device.device_name()], sort_keys=True, default=str)
    return cudnn_graph_cache(key, lambda: CudnnInt8ConvGraph(geom, fusion, bias, residual, activation, out_dtype,
                                                             opts.max_workspace, opts.tuner.cudnn, fp8))


# -- cuBLAS int8 GEMM convolution ---------------------------------------------------------------------
class GemmInt8ConvOp(Op):
    """int8 im2col (skipped for 1x1/stride-1/unpadded) + one cuBLAS int8 GEMM (int32 out) + epilogue.
    The im2col moves 4 channels (one 32-bit word) per thread: quantized channels are a multiple of 4."""

    def __init__(self, geom: ConvGeom, w_nk, deq: Dequant, has_residual: bool):
        self.geom, self.w, self.deq, self.has_residual = geom, w_nk, deq, has_residual
        self.direct = geom.pointwise_gemm()
        self.kdim = geom.ksize * geom.c
        self.np = padded(geom.cout)
        self.cols_bytes = 0 if self.direct else align(geom.rows * self.kdim)
        self.acc_bytes = align(geom.rows * self.np * 4)
        self.workspace = self.cols_bytes + self.acc_bytes
        self.im2col = None if self.direct else im2col_kernel(dataclasses.replace(geom, c=geom.c // 4), 4)
        self.device_bytes = int(w_nk.nbytes) + deq.nbytes
        self.tactic = {"op": "gemm_conv_int8", "im2col": not self.direct, "workspace": self.workspace}

    def run(self, rc, ins, outs):
        g = self.geom
        x = ins[0]
        if self.direct:
            a = x.data.ptr
        else:
            total = g.rows * self.kdim // 4
            kernels.launch(self.im2col, total, (x, rc.workspace, kernels.i64(total)))
            a = rc.workspace_ptr
        acc = rc.scratch(self.cols_bytes, (g.rows, self.np), "int32")
        rc.cublas.gemm("int8", g.rows, g.cout, self.kdim, a, self.kdim, False, self.w.data.ptr, self.kdim, True,
                       acc.data.ptr, self.np, out_dtype="int32")
        acc = acc.reshape(outs[0].shape[:-1] + (self.np,))[..., :g.cout]
        self.deq.run(acc, ins[1] if self.has_residual else None, outs[0], outs[1] if len(outs) > 1 else None)


def _conv_weights(kernel: np.ndarray, cp: int) -> Tuple[np.ndarray, np.ndarray]:
    """int8 weights [Cout, *K, cp] (input channels zero-padded) and the per-output-channel scales."""
    q, s = quantize_weights(kernel, axis=-1)
    if cp > kernel.shape[-2]:
        q = np.concatenate([q, np.zeros(q.shape[:-2] + (cp - q.shape[-2], q.shape[-1]), np.int8)], axis=-2)
    return np.ascontiguousarray(np.moveaxis(q, -1, 0)), s


def int8_conv_operands(spec: Spec) -> Optional[ConvOperands]:
    """The ConvOperands of an INT8 convolution (its input folded by 2x2 pixel blocks where the plan says so,
    ops/conv_fold.py); None for a grouped one."""
    cupy = _device.require()
    layer, quant = spec.layer, spec.quant
    geom = conv_fold.network_geom(spec)
    if geom.groups != 1:
        return None
    has_residual = len(spec.in_shapes) > 1
    residual = (spec.in_shapes[1][0], spec.in_dtypes[1]) if has_residual else None
    w_q, s_w = _conv_weights(layer.weights["kernel"], geom.c)
    if quant.get("folded"):
        w_q, geom = conv_fold.fold_weights(w_q, geom), conv_fold.fold(geom)
    dq = cupy.asarray((np.float32(quant["in_scale"]) * s_w).astype(np.float32))
    bias = layer.weights.get("bias")
    bias32 = cupy.asarray(bias.astype(np.float32)) if bias is not None else None
    dual, res_scale = quant.get("dual_scale"), quant.get("res_scale")
    deq = Dequant(dq, bias32, layer.params.get("activation"), spec.out_dtypes[0], out_scale(spec, INT8),
                  residual[1] if residual else None, np.float32(dual) if dual is not None else None,
                  res_scale=np.float32(res_scale) if has_residual and res_scale is not None else None)
    return ConvOperands("INT8", geom, cupy.asarray(w_q), deq, residual)


OPERANDS["INT8"] = int8_conv_operands


@register("Convolution", formats=("INT8",))
def int8_conv_candidates(spec: Spec) -> List[Op]:
    """cuDNN int8 plans of the most fused graph that has any, our Triton kernel (triton_conv.py) and the cuBLAS
    int8 GEMM path."""
    operands = int8_conv_operands(spec)
    if operands is None:
        return []
    layer, opts = spec.layer, spec.options
    geom, w, deq, residual = operands.geom, operands.w, operands.deq, operands.residual
    activation, bias, out_dtype = layer.params.get("activation"), layer.weights.get("bias"), spec.out_dtypes[0]
    has_residual, dual = residual is not None, deq.dual_scale
    prefer = spec.prefer or {}
    force = settings.INT8_CONV.get()  # tests: only this path ("gemm", "triton" or one of the fusions)
    cands: List[Op] = []
    if (_device.cudnn_module() is not None and prefer.get("op") in (None, "cudnn_conv_int8") and force != "gemm"
            and deq.res_scale is None):  # cuDNN's graphs here take a float residual as it is
        families = set()  # with a second output: the first dual graph with plans, and the first single one
        for fusion in (DUAL_FUSIONS if dual is not None else ()) + INT8_FUSIONS:
            family = "dual" if (fusion.endswith("+q") or (fusion == "conv" and dual is not None)) else "single"
            if family in families or prefer.get("fusion") not in (None, fusion) or force not in (None, fusion):
                continue
            if fusion != "conv" and residual is not None and residual[0] != geom.n:
                continue  # a residual broadcast over the batch stays out of the graph (see conv._fusions)
            if fusion == "fused_nr" and out_dtype != "int8":
                continue
            try:
                graph = _cudnn_int8_graph(geom, fusion, bias is not None, residual, activation, out_dtype, opts)
                plans = graph.plans(opts.cudnn_plans, prefer.get("plan"), opts.cudnn_runtime_plans)
            except Exception as exc:
                logger.debug("cuDNN int8 graph (%s) for %s not supported: %s", fusion, layer.name, exc)
                continue
            if plans:
                families.add(family)
                acc_shape = (geom.n, *geom.out, geom.cout)
                ops = [CudnnInt8ConvOp(graph, plan, w, deq, acc_shape, has_residual) for plan in plans]
                if dual is not None and family == "single":
                    quantize = QuantizeOp(spec.out_shapes[0], out_dtype, dual, geom.cout)
                    ops = [QuantizeAfterOp(op, quantize) for op in ops]
                cands += ops
    if prefer.get("op") in (None, "triton_conv_int8") and force in (None, "triton"):
        cands += triton_conv_candidates("INT8", geom, w, deq, residual, prefer, opts.triton_tiles)
    want_gemm = (prefer.get("op") == "gemm_conv_int8" or (not prefer and (geom.pointwise_gemm() or geom.c < PAD))
                 or not cands)
    if want_gemm and force in (None, "gemm"):
        w_nk = w.reshape(geom.cout, -1)  # [Cout, K]: K-contiguous
        cands.append(GemmInt8ConvOp(geom, w_nk, deq, has_residual))
    return cands


# -- cuBLAS int8 matrix multiply -------------------------------------------------------------------------
class Int8MatMulOp(Op):
    """Batched int8 GEMM C[b] = A[b] B[b] with A [.., M, Kp] and B as [.., N, Kp] (both K-contiguous),
    int32 accumulators in the workspace, then the epilogue. Constant operands are uploaded quantized;
    activation operands arrive quantized (and transposed where needed) from QuantizeOp steps."""

    #: The accumulators' dtype, and the operands' format.
    ACC, FORMAT = "int32", INT8

    def __init__(self, spec: Spec):
        cupy = _device.require()
        q = spec.quant
        out = spec.out_shapes[0]
        self.m, self.n = out[-2], out[-1]
        batch = tuple(out[:-2])
        self.batch = int(np.prod(batch)) if batch else 1
        self.kp = q["kp"]
        ins = iter(range(len(spec.in_shapes)))
        self.sources, self.strides = [], []
        for role, rows in (("a", self.m), ("b", self.n)):
            info = q[role]
            if info["const"] is not None:
                arr = cupy.asarray(info["const"])  # [batch' or 1, rows, Kp] int8
                self.sources.append(("const", arr))
                size = int(np.prod(arr.shape[:-2])) if arr.ndim > 2 else 1
            else:
                i = next(ins)
                self.sources.append(("input", i))
                shape = spec.in_shapes[i]
                size = int(np.prod(shape[:-2])) if len(shape) > 2 else 1
            if size == 1:
                self.strides.append(0)
            elif size == self.batch:
                self.strides.append(rows * self.kp)
            else:
                raise ValueError(f"int8 MatrixMultiply {spec.layer.name!r}: an operand's batch dims only partly "
                                 f"broadcast ({size} of {self.batch})")
        self.np = padded(self.n, 4)
        self.workspace = align(self.batch * self.m * self.np * 4)
        self.deq = matmul_dequant(spec, self.FORMAT, self.ACC)
        self.device_bytes = self.deq.nbytes + sum(int(s[1].nbytes) for s in self.sources if s[0] == "const")
        self.tactic = {"op": "cublas_gemm_int8", "workspace": self.workspace}

    def _ptr(self, source, ins) -> int:
        kind, v = source
        return v.data.ptr if kind == "const" else ins[v].data.ptr

    def run(self, rc, ins, outs):
        acc = rc.scratch(0, (self.batch, self.m, self.np), self.ACC)
        self._gemm(rc, self._ptr(self.sources[0], ins), self._ptr(self.sources[1], ins), acc.data.ptr)
        self.deq.run(acc[:, :, :self.n], None, outs[0].reshape(self.batch, self.m, self.n))

    def _gemm(self, rc, a: int, b: int, acc: int) -> None:
        rc.cublas.gemm("int8", self.m, self.n, self.kp, a, self.kp, False, b, self.kp, True, acc, self.np,
                       batch=self.batch, stride_a=self.strides[0], stride_b=self.strides[1],
                       stride_c=self.m * self.np, out_dtype="int32")


class LtInt8MatMulOp(Int8MatMulOp):
    """The same int8 GEMM (int32 accumulators) through one cuBLASLt algorithm."""

    #: cuBLASLt's operand dtype.
    OPERANDS = "int8"

    def __init__(self, spec: Spec, algo: int, plan=None):
        super().__init__(spec)
        self.plan = plan or cublaslt.LtGemm(
            self.m, self.n, self.kp, self.OPERANDS, out_dtype=self.ACC, trans_b=True, lda=self.kp, ldb=self.kp,
            ldd=self.np, batch=self.batch, stride_a=self.strides[0], stride_b=self.strides[1],
            stride_d=self.m * self.np, max_workspace=CUBLAS_WORKSPACE, algos=2)
        self.algo = algo
        self.tactic = {"op": f"cublaslt_gemm_{'int8' if self.OPERANDS == 'int8' else 'fp8'}", "plan": algo,
                       "workspace": self.workspace}

    def _gemm(self, rc, a: int, b: int, acc: int) -> None:
        ws = rc.cublas
        self.plan.run(self.algo, a, b, acc, ws.workspace_ptr, ws.workspace_bytes, rc.stream.ptr)


@register("MatrixMultiply", formats=("INT8",))
def int8_matmul_candidates(spec: Spec) -> List[Op]:
    """Our Triton kernel's GEMMs (triton_conv.triton_matmul_candidates), the cuBLAS int8 GEMM and cuBLASLt's first
    algorithms (see matmul.gemm_paths)."""
    want_cublas, want_lt = gemm_paths(spec.prefer, "cublas_gemm_int8", "cublaslt_gemm_int8")
    lt: List[Op] = []
    if want_lt:
        try:
            first = LtInt8MatMulOp(spec, 0)
            lt = [first] + [LtInt8MatMulOp(spec, i, first.plan) for i in range(1, len(first.plan.algos))]
            want = (spec.prefer or {}).get("plan")
            lt = [op for op in lt if want in (None, op.algo)]
        except Exception as exc:
            logger.debug("no cuBLASLt int8 candidate for %s: %s", spec.layer.name, exc)
    own = triton_matmul_candidates("INT8", spec, matmul_dequant(spec))
    return ([Int8MatMulOp(spec)] if want_cublas or not (lt or own) else []) + lt + own


def matmul_constant(value: np.ndarray, role: str, transposed: bool, kp: int):
    """A constant matmul operand quantized for the GEMM: ([.., rows, kp] int8, float32 scale per row).

    `role` "a": rows are M (stored [.., M, K], or [.., K, M] when `transposed`); "b": rows are N (stored
    [.., K, N], or [.., N, K] when `transposed`): one scale per output row or column.
    """
    v = np.asarray(value, np.float32)
    k_last = (role == "a") != transposed  # is K the last stored axis?
    rows_k = v if k_last else np.swapaxes(v, -1, -2)  # [.., rows, K]
    q, s = quantize_weights(rows_k, axis=-2)
    pad = kp - q.shape[-1]
    if pad:
        q = np.concatenate([q, np.zeros(q.shape[:-1] + (pad,), np.int8)], axis=-1)
    return np.ascontiguousarray(q), s
