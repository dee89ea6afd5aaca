"""Attention: softmax(q k^T * scale) v as two cuBLAS GEMMs around the softmax kernel (scores in fp32 in the
workspace; any float dtype), reading the packed layout (``heads`` H: q [B, S, H*D], head h in columns
h*D..) in place through strides: no head transposes.

cuDNN 9.19's flash-attention graphs (nvidia-cudnn-frontend 1.32 ``sdpa``) were tried on an H200 and left
out: replayed from a CUDA graph they left their output unchanged, and run eagerly between captured
parts one of four runs came out wrong, so they cannot be trusted here.
"""
from __future__ import annotations

import dataclasses
from typing import List

import numpy as np

from tftrt_py.engine.backends.cupy import kernels
from tftrt_py.engine.backends.cupy.ops.base import Op, Spec, align, register
from tftrt_py.engine.backends.cupy.ops.reduce import row_block, softmax_kernel

__all__ = ["AttentionGeom", "GemmAttentionOp"]


@dataclasses.dataclass(frozen=True)
class AttentionGeom:
    """Batches x heads of [sq, d] x [sk, d]^T -> [sq, sk] -> x [sk, dv], and the scale."""

    batch: int
    heads: int
    sq: int
    sk: int
    d: int
    dv: int
    scale: float

    @classmethod
    def of(cls, spec: Spec) -> "AttentionGeom":
        (q, k, v), heads = spec.in_shapes, spec.params.get("heads") or 1
        batch = int(np.prod(q[:-2])) if len(q) > 2 else 1
        return cls(batch, int(heads), q[-2], k[-2], q[-1] // heads, v[-1] // heads, float(spec.params["scale"]))


class GemmAttentionOp(Op):
    """Scores = scale q k^T (fp32, workspace), softmax into probabilities (compute dtype), out = p v.

    Packed inputs are one strided-batched GEMM per batch row over the heads; plain ones one GEMM."""

    def __init__(self, spec: Spec):
        self.g = g = AttentionGeom.of(spec)
        self.dtype, self.allow_tf32 = spec.cdt, spec.options.allow_tf32
        self.itemsize = np.dtype(self.dtype).itemsize
        count = g.batch * g.heads * g.sq
        self.scores_bytes = align(count * g.sk * 4)
        self.workspace = self.scores_bytes + align(count * g.sk * self.itemsize)
        self.softmax = softmax_kernel("float32", self.dtype)
        self.block = row_block(g.sk)
        self.tactic = {"op": "gemm_attention"}

    def _gemms(self):
        """(outer loop count, per-call batch, q/k/v/out element offsets per outer step, strides)."""
        g = self.g
        if g.heads == 1:
            return 1, g.batch, (0, 0, 0, 0), (g.sq * g.d, g.sk * g.d, g.sk * g.dv, g.sq * g.dv)
        return g.batch, g.heads, (g.sq * g.heads * g.d, g.sk * g.heads * g.d, g.sk * g.heads * g.dv,
                                  g.sq * g.heads * g.dv), (g.d, g.d, g.dv, g.dv)

    def run(self, rc, ins, outs):
        g, cublas, item = self.g, rc.cublas, self.itemsize
        q, k, v, y = (a.data.ptr for a in (*ins, outs[0]))
        scores, probs = rc.workspace_ptr, rc.workspace_ptr + self.scores_bytes
        outer, batch, step, stride = self._gemms()
        ld_q, ld_v = g.heads * g.d, g.heads * g.dv
        per = g.heads * g.sq * g.sk if g.heads > 1 else 0
        for i in range(outer):
            cublas.gemm(self.dtype, g.sq, g.sk, g.d, q + i * step[0] * item, ld_q, False, k + i * step[1] * item,
                        ld_q, True, scores + i * per * 4, g.sk, batch=batch, stride_a=stride[0],
                        stride_b=stride[1], stride_c=g.sq * g.sk, allow_tf32=self.allow_tf32, out_dtype="float32",
                        alpha=g.scale)
        rows = g.batch * g.heads * g.sq
        self.softmax((rows,), (self.block,), (rc.scratch(0, (1,), "float32"), rc.scratch(self.scores_bytes, (1,),
                     self.dtype), kernels.i32(g.sk), kernels.i64(1)))
        for i in range(outer):
            cublas.gemm(self.dtype, g.sq, g.dv, g.sk, probs + i * per * item, g.sk, False, v + i * step[2] * item,
                        ld_v, False, y + i * step[3] * item, ld_v, batch=batch, stride_a=g.sq * g.sk,
                        stride_b=stride[2], stride_c=stride[3], allow_tf32=self.allow_tf32)


@register("Attention")
def attention_candidates(spec: Spec) -> List[Op]:
    return [GemmAttentionOp(spec)]
