"""Two 1x1 convolutions in a row as one kernel (triton/quantized_conv.py's pointwise_chain): a bottleneck's last
convolution (with its residual) and the next block's first, which reads nothing but its output. The kernel
writes the first output once and sums it into the second on chip, so the tensor between them is never read back
(ResNet-50's layer1 at batch 128: 103 MB a block in FP16, 51 MB in INT8 or FP8). The program offers the pair to
the tuner (Tuner.choose_chain), which keeps the chain only where it beats the two layers' own tactics. Both
convolutions run with the operands of their own Triton kernels (triton_conv.conv_operands): the same weights and
epilogues, so the chain writes what the two kernels write (int8 and E4M3 codes equal, fp16 sums in another order).
"""
from __future__ import annotations

import concurrent.futures
import logging
from typing import List, Optional, Tuple

import numpy as np

from tftrt_py.engine.backends.cupy import _device, triton
from tftrt_py.engine.backends.cupy.ops.base import Op, Spec
from tftrt_py.engine.backends.cupy.ops.triton_conv import (GRIDS, QUANTIZED_POINTERS, ConvOperands, activation_code,
                                                           clamps_in_fp16, conv_operands, epilogue_codes,
                                                           kernel_tile, pointer_type, small_sums)

__all__ = ["CHAIN_TILES", "chain_operands", "ChainOp", "chain_candidates", "chain_request"]

logger = logging.getLogger(__name__)

_SOURCE = "tftrt_py.engine.backends.cupy.triton.quantized_conv"
#: Kernels a chain is timed with: (BM rows, BN channels of the first output a step, warps, stages, flat). The ones
#: that won ResNet-50's layer1 pairs at batch 128 on an H200 (int8 and E4M3 flat, fp16 nested) and their
#: neighbours; kernels whose sums do not fit in registers compile to spilling code and lose their timing.
CHAIN_TILES = ((64, 128, 4, 3, True), (128, 64, 4, 3, True), (128, 64, 4, 3, False), (128, 64, 8, 3, True),
               (64, 64, 4, 3, False), (64, 128, 4, 3, False))
#: The widest second output the kernel keeps its sums for on chip (BM x C2 accumulators).
MAX_C2 = 256


def chain_operands(first: Spec, second: Spec) -> Optional[Tuple[ConvOperands, ConvOperands]]:
    """The operands of two convolutions the kernel chains: both 1x1, stride 1, unpadded, in one format; the first
    writing one output (quantized for INT8 and FP8, float16 for FP16), the second reading only that output and
    writing one of its own, of a power of two of channels up to MAX_C2. None for any other pair."""
    if first.layer.kind != "Convolution" or second.layer.kind != "Convolution":
        return None
    if len(first.out_shapes) != 1 or len(second.out_shapes) != 1 or len(second.in_shapes) != 1:
        return None
    a, b = conv_operands(first), conv_operands(second)
    if a is None or b is None or a.fmt != b.fmt or b.residual is not None:
        return None
    ga, gb = a.geom, b.geom
    c2 = gb.cout
    if (not ga.pointwise_gemm() or not gb.pointwise_gemm() or ga.rows != gb.rows or ga.cout != gb.c
            or c2 > MAX_C2 or c2 < 16 or c2 & (c2 - 1) or ga.c < 32 or ga.cout % 64
            or a.deq.dual_scale is not None or b.deq.dual_scale is not None
            or first.out_dtypes[0] != second.in_dtypes[0] or a.deq.out_dtype != b.deq.out_dtype):
        return None
    return a, b


def chain_request(a: ConvOperands, b: ConvOperands, tile, capability: int):
    """The Triton compile request of one CHAIN_TILES kernel for this pair."""
    bm, bn, warps, stages, flat = tile
    fmt, q = a.fmt, QUANTIZED_POINTERS[a.fmt]
    res, out = epilogue_codes(a.residual, a.deq.res_scale is not None, a.deq.out_dtype, False)
    _, out2 = epilogue_codes(None, False, b.deq.out_dtype, False)
    bk = kernel_tile(a.geom, (bm, bn, 64 if fmt == "FP16" else 128, warps, stages))[2]
    bk = min(bk, a.geom.c)
    params = {"x": q, "w": q, "dq": "*fp32", "bias": "*fp32",
              "res": pointer_type(a.residual[1] if a.residual else "float16", fmt),
              "y": pointer_type(a.deq.out_dtype, fmt), "w2": q, "dq2": "*fp32", "bias2": "*fp32",
              "y2": pointer_type(b.deq.out_dtype, fmt), "M": "i32", "res_scale": "fp32", "inv_out": "fp32",
              "inv_out2": "fp32"}
    constexprs = dict(C=a.geom.c, COUT=a.geom.cout, C2=b.geom.cout, HAS_BIAS=a.deq.bias is not None, RES=res,
                      ACT=activation_code(a.deq.activation), OUT=out, HAS_BIAS2=b.deq.bias is not None,
                      ACT2=activation_code(b.deq.activation), OUT2=out2, FP8=fmt != "INT8", BM=bm, BN=bn, BK=bk,
                      FLAT=bool(flat), SMALL_SUMS=small_sums(fmt, a.geom), SMALL_SUMS2=small_sums(fmt, b.geom),
                      CLAMP16=out != 0 and clamps_in_fp16(fmt, a.deq.requant_scale),
                      CLAMP16_2=out2 != 0 and clamps_in_fp16(fmt, b.deq.requant_scale))
    return triton.request(_SOURCE, "pointwise_chain", params, constexprs, capability, num_warps=warps,
                          num_stages=stages)


class ChainOp(Op):
    """One compiled chain kernel, launched with one grid: ins [x, residual?], outs [first output, second]."""

    def __init__(self, a: ConvOperands, b: ConvOperands, kernel, tile, sms: int):
        bm, per_sm = tile[0], tile[5]
        self.a, self.b, self.kernel = a, b, kernel
        inv = [np.float32(1.0) / np.float32(d.requant_scale or 1.0) for d in (a.deq, b.deq)]
        self.scalars = [np.int32(a.geom.rows), np.float32(a.deq.res_scale or 1.0)] + inv
        tiles = -(-a.geom.rows // bm)
        self.grid = min(tiles, per_sm * sms) if per_sm else tiles
        self.device_bytes = sum(int(o.w.nbytes) + o.deq.nbytes for o in (a, b))
        self.tactic = {"op": f"triton_chain_{a.fmt.lower()}", "tile": list(tile)}

    def run(self, rc, ins, outs):
        a, b = self.a.deq, self.b.deq
        ptr = [ins[0].data.ptr, self.a.w.data.ptr, a.dq.data.ptr, a.bias.data.ptr if a.bias is not None else 0,
               ins[1].data.ptr if len(ins) > 1 else 0, outs[0].data.ptr, self.b.w.data.ptr, b.dq.data.ptr,
               b.bias.data.ptr if b.bias is not None else 0, outs[1].data.ptr]
        self.kernel.launch(self.grid, [np.uint64(p) for p in ptr] + self.scalars)


def chain_candidates(first: Spec, second: Spec, prefer: Optional[dict] = None) -> List[Op]:
    """The chain kernels of CHAIN_TILES, each with each distinct grid of GRIDS (the recorded one alone with
    `prefer`), compiled side by side; none where Triton is missing or the pair does not chain."""
    if not triton.available():
        return []
    operands = chain_operands(first, second)
    if operands is None:
        return []
    a, b = operands
    device = _device.require().cuda.Device()
    capability, sms = int(device.compute_capability), device.attributes["MultiProcessorCount"]
    tiles = [t + (g,) for t in CHAIN_TILES for g in GRIDS]
    recorded = (prefer or {}).get("tile")
    if recorded is not None:
        tiles = [t for t in tiles if list(t) == list(recorded)]
    tiles = [t for t in tiles if a.geom.cout % t[1] == 0]

    def build(tile):
        try:
            return triton.compile_kernel(chain_request(a, b, tile, capability))
        except Exception as exc:  # a tile Triton cannot compile for this GPU
            logger.debug("Triton %s chain, tile %s: %s", a.fmt, tile, exc)
            return None

    kernels = dict.fromkeys(t[:5] for t in tiles)
    if not kernels:
        return []
    with concurrent.futures.ThreadPoolExecutor(len(kernels)) as pool:
        kernels = dict(zip(kernels, pool.map(build, kernels)))
    ops = {}
    for t in tiles:
        kernel = kernels[t[:5]]
        if kernel is not None:  # (one needing more shared memory than the GPU has fails when timed)
            op = ChainOp(a, b, kernel, t, sms)
            ops.setdefault((t[:5], op.grid), op)
    return list(ops.values())
