"""Attention: softmax(q k^T * scale) v as one cuDNN flash-attention graph (fp16), or two cuBLAS GEMMs
around the softmax kernel (scores in fp32 in the workspace; any float dtype).

Both read the packed layout (``heads`` H: q [B, S, H*D], head h in columns h*D..) in place, through
strides: no head transposes.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import threading
from typing import List

import numpy as np

from tftrt_py.engine.backends.cupy import _device, kernels
from tftrt_py.engine.backends.cupy.ops.base import Op, Spec, align, register
from tftrt_py.engine.backends.cupy.ops.conv import CudnnConvGraph, cudnn_graph_cache
from tftrt_py.engine.backends.cupy.ops.reduce import row_block, softmax_kernel

__all__ = ["AttentionGeom", "CudnnAttentionOp", "GemmAttentionOp"]

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class AttentionGeom:
    """Batches x heads of [sq, d] x [sk, d]^T -> [sq, sk] -> x [sk, dv]; element strides of each operand."""

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

    def strides(self, s: int, d: int) -> List[int]:
        """[batch, head, row, col] strides of a [.., s, heads*d] tensor."""
        return [s * self.heads * d, d, self.heads * d, 1]


class CudnnAttentionGraph(CudnnConvGraph):
    """cuDNN's scaled-dot-product (flash) attention over [B, H, S, D] views (plans as for convolutions)."""

    def __init__(self, geom: AttentionGeom, max_workspace: int, handle):
        cudnn = _device.cudnn_module()
        half, f32 = cudnn.data_type.HALF, cudnn.data_type.FLOAT
        self.lock = threading.Lock()
        self.fusion, self.dtype = "sdpa", "float16"
        g = cudnn.pygraph(io_data_type=half, intermediate_data_type=f32, compute_data_type=f32, handle=handle)
        b, h = geom.batch, geom.heads
        self.Q = g.tensor(name="Q", dim=[b, h, geom.sq, geom.d], stride=geom.strides(geom.sq, geom.d), data_type=half)
        self.K = g.tensor(name="K", dim=[b, h, geom.sk, geom.d], stride=geom.strides(geom.sk, geom.d), data_type=half)
        self.V = g.tensor(name="V", dim=[b, h, geom.sk, geom.dv], stride=geom.strides(geom.sk, geom.dv),
                          data_type=half)
        o, _ = g.sdpa(q=self.Q, k=self.K, v=self.V, attn_scale=geom.scale, generate_stats=False, name="sdpa")
        o.set_output(True).set_data_type(half).set_dim([b, h, geom.sq, geom.dv]).set_stride(
            geom.strides(geom.sq, geom.dv))
        self.Y = o
        g.validate()
        g.build_operation_graph()
        g.deselect_workspace_greater_than(int(max_workspace))
        g.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
        g.check_support()
        self.graph = g
        self.built = {}
        self.failed = set()


class CudnnAttentionOp(Op):
    #: cuDNN 9.19's attention plans do not run from a captured CUDA graph (measured on an H200: a replay
    #: leaves the output as it was), so this op runs between the captured parts of an engine.
    capturable = False

    def __init__(self, graph: CudnnAttentionGraph, plan):
        self.graph, (self.index, name, self.workspace) = graph, plan
        self.tactic = {"op": "cudnn_sdpa", "plan": name, "workspace": self.workspace}

    def run(self, rc, ins, outs):
        g = self.graph
        pack = {g.Q: ins[0].data.ptr, g.K: ins[1].data.ptr, g.V: ins[2].data.ptr, g.Y: outs[0].data.ptr}
        g.execute(self.index, pack, rc.workspace_ptr if self.workspace else None, rc.cudnn)


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


def _cudnn_candidates(spec: Spec, geom: AttentionGeom) -> List[Op]:
    prefer = spec.prefer or {}
    if (spec.cdt != "float16" or _device.cudnn_module() is None or geom.d % 8 or geom.dv % 8
            or prefer.get("op") not in (None, "cudnn_sdpa")):
        return []
    opts = spec.options
    key = json.dumps(["sdpa", dataclasses.astuple(geom), opts.max_workspace, _device.device_name()])
    try:
        graph = cudnn_graph_cache(key, lambda: CudnnAttentionGraph(geom, opts.max_workspace, opts.tuner.cudnn))
        plans = graph.plans(opts.cudnn_plans, prefer.get("plan"))
    except Exception as exc:
        logger.debug("cuDNN attention for %s not supported: %s", spec.layer.name, exc)
        return []
    return [CudnnAttentionOp(graph, plan) for plan in plans]


@register("Attention")
def attention_candidates(spec: Spec) -> List[Op]:
    geom = AttentionGeom.of(spec)
    cands = _cudnn_candidates(spec, geom)
    if (spec.prefer or {}).get("op") in (None, "gemm_attention") or not cands:
        cands.append(GemmAttentionOp(spec))
    return cands
