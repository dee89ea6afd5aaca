"""Attention: softmax(q k^T * scale) v as two batched cuBLAS GEMMs around the softmax kernel (scores in fp32
in the workspace; any float dtype), reading the packed layout (``heads`` H: q [B, S, H*D], head h in
columns h*D..) in place through leading dimensions: no head transposes; with ``columns``, q, k and v are
column windows of wider inputs (a fused QKV projection), read in place too.

cuDNN 9.19's flash-attention graphs (nvidia-cudnn-frontend 1.32 ``sdpa``) were tried on an H200 and left
out: replayed from a CUDA graph they left their output unchanged, and run eagerly between captured
parts one of four runs came out wrong, so they cannot be trusted here.
"""
from __future__ import annotations

import dataclasses
from typing import List

import numpy as np

from tftrt_py.engine.backends.cupy import _device, kernels
from tftrt_py.engine.backends.cupy.ops.base import Op, Spec, align, register
from tftrt_py.engine.backends.cupy.ops.reduce import row_block, softmax_kernel
from tftrt_py.engine.layers import attention_columns

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
        (q, k, _), heads = spec.in_shapes, spec.params.get("heads") or 1
        (_, wq), _, (_, wv) = attention_columns(spec.layer)
        batch = int(np.prod(q[:-2])) if len(q) > 2 else 1
        return cls(batch, int(heads), q[-2], k[-2], wq // heads, wv // heads, float(spec.params["scale"]))


_POINTERS = r"""
extern "C" __global__ void tt_pointers(const unsigned long long* __restrict__ offsets,
                                       unsigned long long* __restrict__ out, int n, unsigned long long q,
                                       unsigned long long k, unsigned long long s, unsigned long long p,
                                       unsigned long long v, unsigned long long y) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= 6 * n) return;
  unsigned long long base[6] = {q, k, s, p, v, y};
  out[i] = base[i / n] + offsets[i];
}
"""


class GemmAttentionOp(Op):
    """Scores = scale q k^T (fp32, workspace), softmax into probabilities (compute dtype), out = p v: two
    pointer-array batched GEMMs over every (batch, head) matrix, whose addresses a small kernel writes
    into the workspace (so a captured graph replays them for this context's buffers)."""

    def __init__(self, spec: Spec):
        cupy = _device.require()
        self.g = g = AttentionGeom.of(spec)
        self.dtype, self.allow_tf32 = spec.cdt, spec.options.allow_tf32
        item = np.dtype(self.dtype).itemsize
        self.n = n = g.batch * g.heads
        i = np.arange(n, dtype=np.uint64)
        b, h = np.divmod(i, np.uint64(g.heads))
        #: row widths (leading dims) of q, k, v as stored, and where each starts in its row
        self.ld = [s[-1] for s in spec.in_shapes]
        (cq, _), (ck, _), (cv, _) = attention_columns(spec.layer)
        square = g.sq * g.sk
        offsets = np.stack([(b * (g.sq * self.ld[0]) + cq + h * g.d) * item,
                            (b * (g.sk * self.ld[1]) + ck + h * g.d) * item, i * (square * 4), i * (square * item),
                            (b * (g.sk * self.ld[2]) + cv + h * g.dv) * item,
                            (b * (g.sq * g.heads * g.dv) + h * g.dv) * item])
        self.offsets = cupy.asarray(offsets.astype(np.uint64))  # q, k, scores, probs, v, out
        self.device_bytes = int(self.offsets.nbytes)
        self.probs_at = align(n * square * 4)
        self.pointers_at = self.probs_at + align(n * square * item)
        self.workspace = self.pointers_at + align(6 * n * 8)
        self.pointers = kernels.raw_kernel(_POINTERS, "tt_pointers")
        self.softmax = softmax_kernel("float32", self.dtype)
        self.block = row_block(g.sk)
        self.tactic = {"op": "gemm_attention"}

    def run(self, rc, ins, outs):
        g, n, ws = self.g, self.n, rc.workspace_ptr
        bases = [ins[0].data.ptr, ins[1].data.ptr, ws, ws + self.probs_at, ins[2].data.ptr, outs[0].data.ptr]
        self.pointers((-(-6 * n // 256),), (256,), (self.offsets, rc.scratch(self.pointers_at, (6 * n,), "uint64"),
                                                   kernels.i32(n), *map(np.uint64, bases)))
        ptrs = [ws + self.pointers_at + j * n * 8 for j in range(6)]
        rc.cublas.gemm_batched(self.dtype, g.sq, g.sk, g.d, ptrs[0], self.ld[0], False, ptrs[1], self.ld[1], True,
                               ptrs[2], g.sk, n, self.allow_tf32, out_dtype="float32", alpha=g.scale)
        self.softmax((n * g.sq,), (self.block,), (rc.scratch(0, (1,), "float32"),
                                                  rc.scratch(self.probs_at, (1,), self.dtype), kernels.i32(g.sk),
                                                  kernels.i64(1)))
        rc.cublas.gemm_batched(self.dtype, g.sq, g.dv, g.sk, ptrs[3], g.sk, False, ptrs[4], self.ld[2], False, ptrs[5],
                               g.heads * g.dv, n, self.allow_tf32)


@register("Attention")
def attention_candidates(spec: Spec) -> List[Op]:
    return [GemmAttentionOp(spec)]
