"""MatrixMultiply and MLP: batched cuBLAS GEMMs (captured in CUDA graphs through our own handle)
with bias + activation applied by one in-place epilogue kernel."""
from __future__ import annotations

from typing import List

import numpy as np

from tftrt_py.engine.backends.cupy import _device
from tftrt_py.engine.backends.cupy.ops.base import Op, Spec, align, register
from tftrt_py.engine.backends.cupy.ops.pointwise import epilogue_op

__all__ = ["MatMulOp", "MLPOp"]


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
        bias = spec.weights.get("bias")
        self.bias = cupy.asarray(bias.astype(np.float32)) if bias is not None else None
        act = p.get("activation")
        self.epilogue = epilogue_op(self.dtype, self.bias is not None, False, act) if (
            self.bias is not None or act) else None
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
        rc.cublas.gemm(self.dtype, self.m, self.n, self.k, ptrs[0], self.lda, self.ta, ptrs[1], self.ldb, self.tb,
                       y.data.ptr, self.n, batch=self.batch, stride_a=self.strides[0], stride_b=self.strides[1],
                       stride_c=self.m * self.n, allow_tf32=self.allow_tf32)
        if self.epilogue is not None:
            self.epilogue(*([self.bias] if self.bias is not None else []), y)


class MLPOp(Op):
    """Chained GEMM + bias + activation; intermediates ping-pong in the workspace."""

    def __init__(self, spec: Spec):
        cupy = _device.require()
        self.dtype = spec.cdt
        self.allow_tf32 = spec.options.allow_tf32
        self.rows = spec.in_shapes[0][0]
        acts = spec.params["activations"]
        self.layers = []
        for i, act in enumerate(acts):
            w = spec.weights[f"w{i}"]
            self.layers.append((cupy.asarray(w.astype(self.dtype)), cupy.asarray(spec.weights[f"b{i}"].astype(np.float32)),
                                epilogue_op(self.dtype, True, False, act), w.shape[0], w.shape[1]))
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
            rc.cublas.gemm(self.dtype, self.rows, n, k, x.data.ptr, k, False, w.data.ptr, n, False, y.data.ptr, n,
                           allow_tf32=self.allow_tf32)
            epilogue(b, y)
            x = y


@register("MatrixMultiply")
def matmul_candidates(spec: Spec) -> List[Op]:
    if spec.quant is not None:
        from tftrt_py.engine.backends.cupy.ops.int8 import int8_matmul_candidates

        return int8_matmul_candidates(spec)
    return [MatMulOp(spec)]


@register("MLP")
def mlp_candidates(spec: Spec) -> List[Op]:
    return [MLPOp(spec)]
