"""Attention: softmax(masked(q k^T * scale)) v. Three fp16 candidates, timed at build time:

* GemmAttentionOp: two batched cuBLAS GEMMs around a softmax kernel (scores in fp32 in the workspace; any float
  dtype, any head width);
* FlashAttentionOp (fp16, head width 64 or 128): one kernel, tensor-core mma.sync (fp16 in, fp32 accumulate) and
  an online softmax over tiles of 64 keys; the scores never leave registers. Tiles arrive by cp.async into two
  stages (the next loads while this one computes), k and v fragments by ldmatrix. Blocks of 4 or 8 warps (64 or
  128 query rows: the larger reads k and v half as often), timed as two candidates.
* CudnnSdpaOp (fp16; masked scores must weigh nothing): cuDNN's fused flash attention (cuDNN frontend ``sdpa``),
  its plans timed like a convolution's, causal through cuDNN's causal mask. A mask input (packed heads) becomes an
  additive bias (0 kept, -inf masked), and the rows it masks entirely, which the layer defines as a uniform
  softmax over every key, are written after cuDNN as the mean of v. At ViT's 197 tokens it ran 26 us against the
  flash kernel's 47 (batch 32, 12 heads, H100).

INT8 and FP8 Attention (q, k, v quantized at their scales, numpy_precision.py) runs QuantizedAttentionOp: our
Triton flash-attention kernel (triton/quantized_attention.py) on int8 or E4M3 q, k, v, in four tiles timed against
each other, writing fp16 or its output quantized for a quantized reader; whether it runs so or in fp16 is
program.keep_faster_quantized's choice. Its int8 reads halve the bytes of a fused QKV projection's output, which
bounds the fp16 kernels at BERT's 128 tokens (H100, batch 32: 10.2 us INT8, 9.0 FP8, cuDNN fp16 11.6).

All read the packed layout (``heads`` H: q [B, S, H*D], head h in columns h*D..) in place, and with ``columns``
q, k and v as column windows of wider inputs (a fused QKV projection). The first two read the mask input (bool,
broadcast to the scores) through per-(batch, head) offsets and row/column strides (0 where it broadcasts; the flash
kernel stages a mask that is the same for every query row, a padding mask, in shared memory per key tile, and
copies the tile of a mask with rows per query, a causal-and-padding mask, by cp.async with the keys); causal keeps
keys j <= query i, and the flash kernel skips the key tiles above the diagonal (see SKIP_BELOW).

cuDNN's attention is exact from a captured CUDA graph when the handle it runs with is bound to the capturing
stream (``benchmarks/probes/cudnn_sdpa_probe.py``): bound to another stream, its kernel runs at capture time outside the
graph, and a replay leaves the output as it was -- what an earlier version saw.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import threading
from typing import List, Optional, Tuple

import numpy as np

from tftrt_py.engine.backends.cupy import _device, kernels, triton
from tftrt_py.engine.backends.cupy.ops.base import Op, Spec, align, register
from tftrt_py.engine.backends.cupy.ops.conv import CudnnGraph, cudnn_graph_cache
from tftrt_py.engine.backends.cupy.ops.quant import FORMATS, out_scale
from tftrt_py.engine.backends.cupy.ops.reduce import BLOCK_REDUCE, row_block
from tftrt_py.engine.backends.cupy.ops.triton_conv import QUANTIZED_POINTERS
from tftrt_py.engine.errors import BackendError
from tftrt_py.engine.layer_geometry import attention_columns, attention_scores_shape

__all__ = ["AttentionGeom", "MaskView", "GemmAttentionOp", "FlashAttentionOp", "CudnnSdpaOp", "QuantizedAttentionOp",
           "quantized_reason"]

logger = logging.getLogger(__name__)


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
        (q, k, _), heads = spec.in_shapes[:3], spec.params.get("heads") or 1
        (_, wq), _, (_, wv) = attention_columns(spec.layer)
        batch = int(np.prod(q[:-2])) if len(q) > 2 else 1
        return cls(batch, int(heads), q[-2], k[-2], wq // heads, wv // heads, float(spec.params["scale"]))


def mask_strides(shape) -> np.ndarray:
    """Element strides of a contiguous mask of `shape` as it broadcasts to the scores: 0 along its dims of 1."""
    return np.array([int(np.prod(shape[a + 1:])) if shape[a] != 1 else 0 for a in range(len(shape))])


@dataclasses.dataclass
class MaskView:
    """Where score (n, i, j) of (batch x head) matrix n finds its mask byte: offsets[n] + i * si + j * sj."""

    offsets: object  # device int64 [batch * heads]
    si: int
    sj: int

    @classmethod
    def of(cls, spec: Spec) -> Optional["MaskView"]:
        if len(spec.in_shapes) < 4:
            return None
        shape, scores = spec.in_shapes[3], attention_scores_shape(spec.layer)
        strides = mask_strides(shape)
        index = np.indices(scores[:-2]).reshape(len(scores) - 2, -1).T
        offsets = (index * strides[:-2]).sum(axis=1).astype(np.int64)
        return cls(_device.require().asarray(offsets), int(strides[-2]), int(strides[-1]))

    def args(self, ins) -> tuple:
        return ins[3], self.offsets, kernels.i64(self.si), kernels.i64(self.sj)


#: a causal kernel skips the keys above the diagonal only where their scores' mask value cannot weigh: without a
#: mask input (which may mask every key of a row: a uniform softmax over all keys) and with a mask value whose
#: exp underflows to 0 against any score of fp16 inputs
SKIP_BELOW = -1e20


def _mask_head(spec: Spec) -> str:
    causal, masked = bool(spec.params.get("causal")), len(spec.in_shapes) > 3
    skip = causal and not masked and float(spec.params["mask_value"]) < SKIP_BELOW
    return f"#define HAS_MASK {int(masked)}\n#define CAUSAL {int(causal)}\n#define SKIP_ABOVE {int(skip)}\n"


_POINTERS = kernels.source("pointers.cu")

_MASKED_SOFTMAX = BLOCK_REDUCE + kernels.source("masked_softmax.cu")


def _mask_value(spec: Spec) -> np.float32:
    return np.float32(spec.params.get("mask_value") or 0.0)


class GemmAttentionOp(Op):
    """Scores = scale q k^T (fp32, workspace), masked softmax into probabilities (compute dtype), out = p v: two
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
        self.ld = [s[-1] for s in spec.in_shapes[:3]]
        (cq, _), (ck, _), (cv, _) = attention_columns(spec.layer)
        square = g.sq * g.sk
        offsets = np.stack([(b * (g.sq * self.ld[0]) + cq + h * g.d) * item,
                            (b * (g.sk * self.ld[1]) + ck + h * g.d) * item, i * (square * 4), i * (square * item),
                            (b * (g.sk * self.ld[2]) + cv + h * g.dv) * item,
                            (b * (g.sq * g.heads * g.dv) + h * g.dv) * item])
        self.offsets = cupy.asarray(offsets.astype(np.uint64))  # q, k, scores, probs, v, out
        self.mask = MaskView.of(spec)
        self.device_bytes = int(self.offsets.nbytes + (self.mask.offsets.nbytes if self.mask else 0))
        self.probs_at = align(n * square * 4)
        self.pointers_at = self.probs_at + align(n * square * item)
        self.workspace = self.pointers_at + align(6 * n * 8)
        self.pointers = kernels.raw_kernel(_POINTERS, "tt_pointers")
        head = _mask_head(spec) + f"#define TO {kernels.raw_type(self.dtype)}\n"
        self.softmax = kernels.raw_kernel(head + _MASKED_SOFTMAX, "tt_masked_softmax")
        self.mask_value = _mask_value(spec)
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
        mask = self.mask.args(ins) if self.mask else (np.uint64(0), np.uint64(0), kernels.i64(0), kernels.i64(0))
        self.softmax((n * g.sq,), (self.block,), (rc.scratch(0, (1,), "float32"),
                                                  rc.scratch(self.probs_at, (1,), self.dtype), kernels.i32(g.sk),
                                                  kernels.i32(g.sq), *mask, self.mask_value))
        rc.cublas.gemm_batched(self.dtype, g.sq, g.dv, g.sk, ptrs[3], g.sk, False, ptrs[4], self.ld[2], False, ptrs[5],
                               g.heads * g.dv, n, self.allow_tf32)


_FLASH = kernels.source("flash_attention.cu")

#: head widths the flash kernel is built for, and its block sizes (warps of 16 query rows)
FLASH_HEAD_DIMS = (64, 128)
FLASH_WARPS = (4, 8)
#: head widths given to cuDNN's fused attention (its fp16 kernels take multiples of 8 up to 128 on every GPU)
SDPA_HEAD_DIMS = range(8, 129, 8)


def _fp16_reason(spec: Spec, head_dims) -> Optional[str]:
    """Why a fused fp16 kernel for q/k/v heads of equal width in `head_dims`, 16-byte aligned, cannot run this
    Attention, or None."""
    g = AttentionGeom.of(spec)
    starts = [c for c, _ in attention_columns(spec.layer)]
    if spec.cdt != "float16" or any(d != "float16" for d in spec.in_dtypes[:3]):
        return "computes in fp16 only"
    if g.d != g.dv or g.d not in head_dims:
        return f"head widths {g.d}, {g.dv} not one of {tuple(head_dims)}"
    if any(s[-1] % 8 for s in spec.in_shapes[:3]) or any(c % 8 for c in starts):
        return "rows or columns not 16-byte aligned"
    return None


def flash_reason(spec: Spec) -> Optional[str]:
    """Why the flash kernel cannot run this Attention, or None."""
    return _fp16_reason(spec, FLASH_HEAD_DIMS)


class FlashAttentionOp(Op):
    """Flash attention in one kernel (see the module docstring) in blocks of `warps` warps; q, k, v and the
    output 16-byte aligned."""

    def __init__(self, spec: Spec, warps: int = 4):
        reason = flash_reason(spec)
        if reason:
            raise ValueError(f"flash attention {reason}")
        self.g = g = AttentionGeom.of(spec)
        self.ld = [s[-1] for s in spec.in_shapes[:3]]
        self.starts = [c * 2 for c, _ in attention_columns(spec.layer)]  # bytes into each row
        self.mask = MaskView.of(spec)
        self.device_bytes = int(self.mask.offsets.nbytes) if self.mask else 0
        self.key_mask, self.row_mask = self._mask_kind()
        head = _mask_head(spec) + (f"#define HD {g.d}\n#define WARPS {warps}\n#define KEY_MASK {int(self.key_mask)}\n"
                                   f"#define ROW_MASK {int(self.row_mask)}\n")
        self.kernel = kernels.raw_kernel(head + _FLASH, "tt_flash_attention")
        self.warps, self.smem = warps, (16 * warps + 2 * 2 * 64) * (g.d + 8) * 2  # q rows, two k and v stages
        self.kernel.max_dynamic_shared_size_bytes = self.smem
        self.mask_value = _mask_value(spec)
        self.tactic = {"op": "flash_attention", "warps": warps}

    def _mask_kind(self) -> Tuple[bool, bool]:
        """(key, rows) -- key: one mask row for every query (staged per key tile); rows: a row per query that
        cp.async can copy (contiguous keys, 16-byte aligned rows, keys a multiple of 16); neither: mask bytes read
        one by one."""
        m = self.mask
        key = m is not None and m.si == 0
        rows = (m is not None and not key and m.sj == 1 and m.si % 16 == 0 and self.g.sk % 16 == 0
                and not bool((m.offsets % 16).any()))
        return key, rows

    def run(self, rc, ins, outs):
        g = self.g
        ptrs = [a.data.ptr + c for a, c in zip(ins[:3], self.starts)] + [outs[0].data.ptr]
        if any(p % 16 for p in ptrs) or (self.row_mask and ins[3].data.ptr % 16):
            raise ValueError("flash attention needs 16-byte aligned q, k, v, mask and output")
        mask = self.mask.args(ins) if self.mask else (np.uint64(0), np.uint64(0), kernels.i64(0), kernels.i64(0))
        self.kernel((-(-g.sq // (16 * self.warps)), g.batch * g.heads), (32 * self.warps,),
                    (*map(np.uint64, ptrs), *mask, *map(kernels.i32, (g.sq, g.sk, g.heads, *self.ld, g.heads * g.dv)),
                     np.float32(g.scale), self.mask_value), shared_mem=self.smem)


def sdpa_reason(spec: Spec) -> Optional[str]:
    """Why cuDNN's fused attention cannot run this Attention, or None."""
    reason = _fp16_reason(spec, SDPA_HEAD_DIMS)
    if reason:
        return reason
    if _device.cudnn_module() is None or spec.options.tuner is None or spec.options.tuner.cudnn is None:
        return "no cuDNN frontend"
    masked = len(spec.in_shapes) > 3
    if (masked or spec.params.get("causal")) and not float(spec.params["mask_value"]) < SKIP_BELOW:
        return "a mask value that weighs (cuDNN's masked scores weigh nothing)"
    if masked and (not spec.params.get("heads") or len(spec.in_shapes[3]) != 4):
        return "a mask that is not [B or 1, H or 1, Sq or 1, Sk] over packed heads"
    return None


#: A mask as cuDNN's additive bias: 0 where kept, -inf where masked.
_MASK_BIAS = ("bool m", "float16 b", "b = m ? (float16)0.0f : (float16)__int_as_float(0xff800000)",
              "tt_sdpa_mask_bias")

#: Rows the mask masks entirely are a uniform softmax over every key (the mask replaces each score by the same
#: value), where cuDNN's added -inf gives no answer: one warp per mask row finds its first kept key and writes the
#: mean of v over all keys into each score row it masks entirely (none in most batches).
_MASKED_ROWS = kernels.source("sdpa_masked_rows.cu")


class CudnnSdpaGraph(CudnnGraph):
    """cuDNN's scaled-dot-product (flash) attention over [batch, heads, rows, head width] views of the windows the
    layer reads: row strides `lds` (q, k, v), the output packed [batch, rows, heads * dv]; with `bias` (its dims)
    an fp16 bias added to the scores."""

    def __init__(self, g: AttentionGeom, lds: Tuple[int, int, int], causal: bool, bias: Optional[Tuple[int, ...]],
                 max_workspace: int, handle):
        cudnn = _device.cudnn_module()
        half, f32 = cudnn.data_type.HALF, cudnn.data_type.FLOAT
        self.lock = threading.Lock()
        graph = cudnn.pygraph(io_data_type=half, intermediate_data_type=f32, compute_data_type=f32, handle=handle)

        def view(name, rows, width, ld):
            return graph.tensor(name=name, dim=[g.batch, g.heads, rows, width], stride=[rows * ld, width, ld, 1],
                                data_type=half)

        self.Q, self.K, self.V = (view(n, r, w, ld) for n, r, w, ld in zip("QKV", (g.sq, g.sk, g.sk),
                                                                          (g.d, g.d, g.dv), lds))
        self.B = None
        if bias is not None:
            self.B = graph.tensor(name="bias", dim=list(bias), stride=[int(np.prod(bias[a + 1:])) for a in range(4)],
                                  data_type=half)
        y, _ = graph.sdpa(q=self.Q, k=self.K, v=self.V, attn_scale=g.scale, is_inference=True,
                          use_causal_mask=causal, bias=self.B, name="sdpa")
        y.set_output(True).set_data_type(half).set_dim([g.batch, g.heads, g.sq, g.dv]).set_stride(
            [g.sq * g.heads * g.dv, g.dv, g.heads * g.dv, 1])
        self.Y = y
        graph.validate()
        graph.build_operation_graph()
        graph.deselect_workspace_greater_than(int(max_workspace))
        graph.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
        graph.check_support()
        self._adopt(graph, handle)


class CudnnSdpaOp(Op):
    """One plan of a CudnnSdpaGraph, run with the context's cuDNN handle (bound to the stream being captured); a
    mask input becomes the bias (in the workspace, ahead of cuDNN's) and its entirely masked rows are written after
    (_MASKED_ROWS)."""

    uses_cudnn = True

    def __init__(self, spec: Spec, graph: CudnnSdpaGraph, plan: Tuple[int, str, int]):
        self.graph, (self.index, name, self.plan_workspace) = graph, plan
        self.g, self.causal = AttentionGeom.of(spec), bool(spec.params.get("causal"))
        self.starts = [c * 2 for c, _ in attention_columns(spec.layer)]  # bytes into each row
        self.ldv = spec.in_shapes[2][-1]
        self.mask = tuple(spec.in_shapes[3]) if len(spec.in_shapes) > 3 else None
        self.bias_bytes = align(int(np.prod(self.mask)) * 2) if self.mask else 0
        self.workspace = self.bias_bytes + self.plan_workspace
        if self.mask:
            self.to_bias = kernels.elementwise(*_MASK_BIAS)
            self.masked_rows = kernels.raw_kernel(_MASKED_ROWS, "tt_sdpa_masked_rows")
        self.tactic = {"op": "cudnn_sdpa", "plan": name, "workspace": self.workspace}

    def run(self, rc, ins, outs):
        g, y = self.graph, outs[0]
        q, k, v = (a.data.ptr + c for a, c in zip(ins[:3], self.starts))
        if any(p % 16 for p in (q, k, v, y.data.ptr)):
            raise ValueError("cuDNN attention needs 16-byte aligned q, k, v and output")
        pack = {g.Q: q, g.K: k, g.V: v, g.Y: y.data.ptr}
        if self.mask:
            bias = rc.scratch(0, self.mask, "float16")
            self.to_bias(ins[3], bias)
            pack[g.B] = bias.data.ptr
        g.execute(self.index, pack, rc.workspace_ptr + self.bias_bytes if self.plan_workspace else None, rc.cudnn)
        if self.mask:
            geom, (mb, mh, mq, _) = self.g, self.mask
            rows = mb * mh * mq
            self.masked_rows((-(-rows // 8),), (256,), (
                ins[3], *map(kernels.i32, (mb, mh, mq, geom.sk, geom.batch, geom.heads, geom.sq, self.causal)),
                np.uint64(v), kernels.i64(self.ldv), kernels.i32(geom.dv), y))


def _sdpa_candidates(spec: Spec) -> List[Op]:
    prefer = spec.prefer or {}
    if prefer.get("op") not in (None, "cudnn_sdpa") or sdpa_reason(spec) is not None:
        return []
    g, opts = AttentionGeom.of(spec), spec.options
    lds = tuple(s[-1] for s in spec.in_shapes[:3])
    causal = bool(spec.params.get("causal"))
    bias = tuple(spec.in_shapes[3]) if len(spec.in_shapes) > 3 else None
    key = json.dumps(["sdpa", dataclasses.astuple(g), lds, causal, bias, opts.max_workspace, _device.device_name()])
    try:
        graph = cudnn_graph_cache(key, lambda: CudnnSdpaGraph(g, lds, causal, bias, opts.max_workspace,
                                                              opts.tuner.cudnn))
        plans = graph.plans(opts.cudnn_plans, prefer.get("plan"), opts.cudnn_runtime_plans)
    except Exception as exc:
        logger.debug("cuDNN attention for %s not supported: %s", spec.layer.name, exc)
        return []
    return [CudnnSdpaOp(spec, graph, plan) for plan in plans]


#: Tiles of the quantized attention kernel (triton/quantized_attention.py): (BM query rows, BN keys a step, warps).
QUANTIZED_TILES = ((64, 128, 4), (128, 64, 8), (128, 128, 8), (64, 64, 4))
QUANTIZED_HEAD_DIMS = (32, 64, 128)
_QUANTIZED_SOURCE = "tftrt_py.engine.backends.cupy.triton.quantized_attention"
_I32 = 2 ** 31


def quantized_reason(layer) -> Optional[str]:
    """Why the quantized attention kernel cannot run this INT8 or FP8 Attention layer, or None."""
    heads, (q, k, v) = layer.params.get("heads"), layer.inputs[:3]
    (cq, wq), (ck, wk), (cv, wv) = attention_columns(layer)
    if not triton.available():
        return "no Triton"
    if not heads or wq != wk or wq != wv or wq // heads not in QUANTIZED_HEAD_DIMS:
        return f"not packed heads of one width in {QUANTIZED_HEAD_DIMS}"
    if any(t.shape[-1] % 16 or c % 16 for t, c in zip((q, k, v), (cq, ck, cv))):
        return "rows or columns not 16-byte aligned"
    strides = mask_strides(layer.inputs[3].shape)[-2:] if len(layer.inputs) > 3 else (0, 0)
    if (max(int(np.prod(t.shape)) for t in layer.inputs[:3] + layer.outputs[:1]) >= _I32
            or int(max(strides)) * max(q.shape[1], k.shape[1]) >= _I32):
        return "offsets past 32 bits"
    return None


def _quantized_mask_code(mask: Optional[MaskView]) -> int:
    """0 no mask input, 1 a mask row shared by every query (a padding mask: read once per key tile), 2 any other."""
    return 0 if mask is None else 1 if mask.si == 0 else 2


class QuantizedAttentionOp(Op):
    """Flash attention on int8 (E4M3) q, k, v of one tile of QUANTIZED_TILES (triton/quantized_attention.py),
    writing fp16 or the output quantized at its scale; ``spec.quant["scales"]``: the scales of q, k and v."""

    def __init__(self, spec: Spec, fmt: str, mask: Optional[MaskView], kernel, tile):
        self.g = g = AttentionGeom.of(spec)
        self.kernel, self.bm = kernel, tile[0]
        self.starts = [c for c, _ in attention_columns(spec.layer)]  # bytes into each row (one a value)
        self.mask = mask
        self.device_bytes = int(self.mask.offsets.nbytes) if self.mask else 0
        s_q, s_k, s_v = (np.float64(s) for s in spec.quant["scales"])
        log2e = np.log2(np.e)
        y_scale = out_scale(spec, FORMATS[fmt])
        mask_value = max(float(_mask_value(spec)) * log2e, float(-np.finfo(np.float32).max))  # finite: see kernel
        self.scalars = [kernels.i32(v) for v in (g.sq, g.sk, g.heads, *(s[-1] for s in spec.in_shapes[:3]))] + [
            np.float32(s_q * s_k * g.scale * log2e), np.float32(s_v),
            np.float32(1.0) / np.float32(y_scale or 1.0), np.float32(mask_value)]
        self.tactic = {"op": f"quantized_attention_{fmt.lower()}", "tile": list(tile)}

    def run(self, rc, ins, outs):
        g = self.g
        ptrs = [a.data.ptr + c for a, c in zip(ins[:3], self.starts)] + [outs[0].data.ptr]
        if any(p % 16 for p in ptrs + [ins[3].data.ptr if self.mask else 0]):
            raise ValueError("quantized attention needs 16-byte aligned q, k, v, mask and output")
        mask = ([ins[3].data.ptr, self.mask.offsets.data.ptr], [self.mask.si, self.mask.sj]) if self.mask else (
            [0, 0], [0, 0])
        self.kernel.launch(-(-g.sq // self.bm) * g.batch * g.heads,
                           [np.uint64(p) for p in ptrs + mask[0]] + [kernels.i32(v) for v in mask[1]] + self.scalars)


def quantized_kernel_request(fmt: str, spec: Spec, mask: Optional[MaskView], tile, capability: int):
    """The Triton compile request of one tile for this INT8 or FP8 Attention (triton.request)."""
    q = QUANTIZED_POINTERS[fmt]
    out = 0 if spec.out_dtypes[0] == "float16" else 1
    params = {"q": q, "k": q, "v": q, "y": "*fp16" if out == 0 else q, "mask": "*i8", "moff": "*i64", "si": "i32",
              "sj": "i32", "SQ": "i32", "SK": "i32", "H": "i32", "ldq": "i32", "ldk": "i32", "ldv": "i32",
              "qk_scale": "fp32", "v_scale": "fp32", "inv_out": "fp32", "mask_value": "fp32"}
    bm, bn, warps = tile
    constexprs = dict(HD=AttentionGeom.of(spec).d, BM=bm, BN=bn, FP8=fmt == "FP8", OUT=out,
                      MASKED=_quantized_mask_code(mask), CAUSAL=bool(spec.params.get("causal")))
    return triton.request(_QUANTIZED_SOURCE, "attention_quantized", params, constexprs, capability,
                          ("ldq", "ldk", "ldv"), warps, 2)


@register("Attention", formats=("INT8", "FP8"))
def quantized_candidates(spec: Spec) -> List[Op]:
    """The quantized attention kernel in each tile of QUANTIZED_TILES (the recorded one alone where it is one of
    them); a BackendError where quantized_reason says it cannot run (program.quantized_layers keeps those FP16)."""
    fmt = spec.quant["format"]
    reason = quantized_reason(spec.layer)
    if reason is not None:
        raise BackendError(f"no {fmt} attention kernel for {spec.layer.name}: {reason}")
    tiles = list(QUANTIZED_TILES)
    recorded = (spec.prefer or {}).get("tile")
    if isinstance(recorded, list) and tuple(recorded) in tiles:
        tiles = [tuple(recorded)]
    capability = int(_device.require().cuda.Device().compute_capability)
    mask, ops = MaskView.of(spec), []
    for tile in tiles:
        try:
            ops.append(QuantizedAttentionOp(spec, fmt, mask, triton.compile_kernel(
                quantized_kernel_request(fmt, spec, mask, tile, capability)), tile))
        except Exception as exc:  # a tile Triton cannot compile for this GPU
            logger.debug("%s attention %s, tile %s: %s", fmt, spec.layer.name, tile, exc)
    return ops


@register("Attention")
def attention_candidates(spec: Spec) -> List[Op]:
    """Every candidate, or those of the op a recorded tactic names (none left: the tuner times all again)."""
    if spec.quant is not None:
        return quantized_candidates(spec)
    prefer = spec.prefer or {}
    op = prefer.get("op")
    gemm = [GemmAttentionOp(spec)] if op in (None, "gemm_attention") else []
    flash = []
    if op in (None, "flash_attention") and flash_reason(spec) is None:
        warps = [prefer["warps"]] if prefer.get("warps") in FLASH_WARPS else FLASH_WARPS
        flash = [FlashAttentionOp(spec, w) for w in warps]
    return gemm + flash + _sdpa_candidates(spec)
