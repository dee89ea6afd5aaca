"""The int8 convolution of our own Triton kernel (triton/conv_int8_kernel.py): implicit GEMM on int8 tensor cores,
dequantization, bias, residual (fp16, int8 with its scale, or fp16 rounded to its int8 grid), ReLU and the
output's requantization in one kernel, so an int8 layer between int8 layers reads and writes bytes only.
Written because cuDNN's int8 graphs on Hopper are runtime-fusion kernels no faster than its fp16 ones wherever
memory bounds a layer (README "Where the time goes"); chosen per layer by timing, like every tactic.
"""
from __future__ import annotations

import concurrent.futures
import logging
from typing import List, Optional, Tuple

import numpy as np

from tftrt_py.engine.backends.cupy import _device
from tftrt_py.engine.backends.cupy.ops.base import Op
from tftrt_py.engine.backends.cupy.ops.conv import ConvGeom
from tftrt_py.engine.backends.cupy.ops.int8 import Dequant

__all__ = ["TILES", "GRIDS", "TritonInt8ConvOp", "triton_conv_candidates", "prefetch", "kernel_request"]

logger = logging.getLogger(__name__)

#: Kernels compiled per layer: (BM pixels, BN channels, warps, pipeline stages): the five that won ResNet-50's
#: convolutions at batch 128 on an H100 out of ten tried (benchmarks/int8_conv_probe.py --tiles).
TILES = ((128, 128, 4, 3), (64, 64, 4, 3), (128, 64, 4, 2), (256, 64, 8, 3), (128, 64, 4, 4))
#: Grids each kernel is timed with: programs per SM (a persistent kernel), or 0 for one program per tile.
GRIDS = (0, 1, 2, 4)
_SOURCE = "tftrt_py.engine.backends.cupy.triton.conv_int8_kernel"
_I32 = 2 ** 31


def _pointer(dtype: str) -> str:
    return {"int8": "*i8", "float16": "*fp16", "float32": "*fp32"}[dtype]


def fits(geom: ConvGeom, activation, residual) -> bool:
    """The convolutions the kernel covers: 2-d, ungrouped, undilated, symmetric padding, channels a multiple of
    32 (or of 4 below 32: a stem), int32 offsets, ReLU or no activation, a residual of the output's batch."""
    return (len(geom.spatial) == 2 and geom.groups == 1 and geom.dilations == (1, 1) and geom.pre == geom.post
            and geom.c % (32 if geom.c >= 32 else 4) == 0 and geom.n * int(np.prod(geom.spatial)) * geom.c < _I32
            and geom.rows * geom.cout < _I32 and (activation or {}).get("type") in (None, "relu")
            and (residual is None or residual[0] == geom.n))


def kernel_request(geom: ConvGeom, has_bias: bool, relu: bool, residual: Optional[Tuple[int, str]],
                   residual_scaled: bool, out_dtype: str, dual: bool, tile, capability: int):
    """The Triton compile request of one tile for this convolution and epilogue (triton.request)."""
    from tftrt_py.engine.backends.cupy import triton

    bm, bn, warps, stages = tile[:4]
    out = 1 if out_dtype == "int8" else 2 if dual else 0
    res = 0 if residual is None else 2 if residual[1] == "int8" else 3 if residual_scaled else 1
    params = {"x": "*i8", "w": "*i8", "dq": "*fp32", "bias": "*fp32",
              "res": _pointer(residual[1] if residual else "float16"), "y": _pointer(out_dtype), "yq": "*i8",
              "M": "i32", "H": "i32", "W": "i32", "OH": "i32", "OW": "i32", "C": "i32", "COUT": "i32",
              "res_scale": "fp32", "inv_out": "fp32"}
    (kh, kw), (sh, sw), (ph, pw) = geom.kernel, geom.strides, geom.pre
    constexprs = dict(KH=kh, KW=kw, SH=sh, SW=sw, PH=ph, PW=pw, HAS_BIAS=bool(has_bias), RES=res, RELU=bool(relu),
                      OUT=out, BM=bm, BN=bn, BK=64 if geom.c % 64 == 0 else 32, GROUP=8,
                      SMALL_C=geom.c if geom.c < 32 else 0)
    multiples = ("C", "COUT") if geom.cout % 16 == 0 else ("C",)
    return triton.request(_SOURCE, "conv_int8", params, constexprs, capability, multiples, warps, stages)


def _request(geom: ConvGeom, deq: Dequant, residual, tile, capability: int):
    return kernel_request(geom, deq.bias is not None, bool(deq.activation), residual, deq.res_scale is not None,
                          deq.out_dtype, deq.dual_scale is not None, tile, capability)


def prefetch(convolutions) -> None:
    """Start compiling every tile of these convolutions: (geom, has bias, activation, residual (batch, dtype) or
    None, residual scaled, output dtype) each, those the kernel fits."""
    from tftrt_py.engine.backends.cupy import triton

    if not triton.available():
        return
    capability = int(_device.require().cuda.Device().compute_capability)
    triton.prefetch([kernel_request(geom, bias, bool(act), residual, scaled, out, False, tile, capability)
                     for geom, bias, act, residual, scaled, out in convolutions
                     if fits(geom, act, residual) for tile in TILES])


class TritonInt8ConvOp(Op):
    """One compiled kernel of the Triton int8 convolution, launched with one grid."""

    def __init__(self, geom: ConvGeom, w, deq: Dequant, kernel, tile, sms: int):
        bm, bn, _, _, per_sm = tile
        self.w, self.deq, self.kernel = w, deq, kernel
        self.scalars = [np.int32(v) for v in (geom.rows, *geom.spatial, *geom.out, geom.c, geom.cout)] + [
            np.float32(deq.res_scale or 1.0), np.float32(1.0) / np.float32(deq.requant_scale or 1.0)]
        tiles = -(-geom.rows // bm) * -(-geom.cout // bn)
        self.grid = min(tiles, per_sm * sms) if per_sm else tiles
        self.device_bytes = int(w.nbytes) + deq.nbytes
        self.tactic = {"op": "triton_conv_int8", "tile": list(tile)}

    def run(self, rc, ins, outs):
        d = self.deq
        ptr = [ins[0].data.ptr, self.w.data.ptr, d.dq.data.ptr, d.bias.data.ptr if d.bias is not None else 0,
               ins[1].data.ptr if len(ins) > 1 else 0, outs[0].data.ptr, outs[1].data.ptr if len(outs) > 1 else 0]
        self.kernel.launch(self.grid, [np.uint64(p) for p in ptr] + self.scalars)


def triton_conv_candidates(geom: ConvGeom, w, deq: Dequant, residual: Optional[Tuple[int, str]],
                           prefer: dict) -> List[Op]:
    """Each kernel of TILES (prefetched, or compiled side by side here) with each grid of GRIDS, or the recorded
    tile when it is one of them (a plan's other values are not compiled); none where Triton is missing or the
    convolution does not fit."""
    from tftrt_py.engine.backends.cupy import triton

    if not triton.available() or not fits(geom, deq.activation, residual):
        return []
    tiles = [t + (g,) for t in TILES for g in GRIDS]
    recorded = prefer.get("tile")
    if isinstance(recorded, list) and tuple(recorded) in tiles:
        tiles = [tuple(recorded)]
    kernels = {t[:4]: None for t in tiles}

    device = _device.require().cuda.Device()
    capability, sms = int(device.compute_capability), device.attributes["MultiProcessorCount"]

    def build(tile):
        try:
            return triton.compile_kernel(_request(geom, deq, residual, tile, capability))
        except Exception as exc:  # a tile Triton cannot compile for this GPU
            logger.debug("Triton int8 convolution, tile %s: %s", tile, exc)
            return None

    with concurrent.futures.ThreadPoolExecutor(len(kernels)) as pool:
        kernels = dict(zip(kernels, pool.map(build, kernels)))
    return [TritonInt8ConvOp(geom, w, deq, kernels[t[:4]], t, sms) for t in tiles if kernels[t[:4]]]
