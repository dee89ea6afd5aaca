"""The int8 and FP8 convolution of our own Triton kernel (triton/quantized_conv.py): implicit GEMM on int8 (E4M3)
tensor cores, dequantization, bias, residual (fp16, quantized with its scale, or fp16 rounded to its quantized
grid), ReLU and the output's requantization in one kernel, so a quantized layer between quantized layers reads
and writes bytes only. Written because cuDNN's int8 and FP8 graphs on Hopper are runtime-fusion kernels no
faster than its fp16 ones wherever memory bounds a layer (README "Where the time goes"); chosen per layer by
timing, like every tactic. The same kernel on fp16 operands is a candidate for FP16 convolutions too
(fp16_conv_candidates), beside cuDNN's plans.
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
from typing import Callable, Dict, List, Optional, Tuple

import numpy as np

from tftrt_py import settings
from tftrt_py.engine.backends.cupy import _device, triton
from tftrt_py.engine.backends.cupy.cublaslt import REDUCED_GELU
from tftrt_py.engine.backends.cupy.ops import conv_fold
from tftrt_py.engine.backends.cupy.ops.base import Op, Spec
from tftrt_py.engine.backends.cupy.ops.conv import FLOAT16_FACTORIES, ConvGeom
from tftrt_py.engine.backends.cupy.ops.quant import Dequant

__all__ = ["TILES", "TILE_ORDERS", "size_class", "conv_tiles", "GEMM_TILES", "GRIDS", "TritonConvOp",
           "triton_conv_candidates", "fp16_conv_candidates", "triton_matmul_candidates", "gemm_geom",
           "prefetch_requests", "kernel_request", "epilogue_codes", "clamps_in_fp16", "QUANTIZED_POINTERS",
           "ConvOperands", "OPERANDS", "conv_operands", "activation_code",
           "pointer_type", "small_sums"]

logger = logging.getLogger(__name__)

#: Kernels a convolution may be timed with: (BM pixels, BN channels, BK bytes of K a step, warps, pipeline stages):
#: the eight that won ResNet-50's convolutions at batch 128 on an H100 out of sixteen tried
#: (benchmarks/probes/quantized_conv_probe.py --tiles; BK 128 won most layers of 128 channels or more, 8-warp tiles
#: none). A layer whose channels BK does not divide steps through 64 (or 32) of them.
TILES = ((128, 128, 128, 4, 3), (64, 128, 128, 4, 3), (64, 64, 128, 4, 3), (128, 64, 128, 4, 3), (128, 64, 64, 4, 4),
         (64, 64, 64, 4, 3), (128, 128, 64, 4, 3), (128, 64, 64, 4, 2))
#: The order in which the tiles suit a convolution, by its shape: "narrow" (64 output channels or fewer), "small"
#: (under one wave of 128x128 output tiles on the GPU's SMs), "medium" (one to four waves), "large". A build
#: compiles and times the first BuildOptions.triton_tiles of its class (each kernel costs about a second of a CPU
#: core to compile). Measured with every tile timed on ResNet-50's INT8 and FP8 layers on an H200: with the first
#: three, the sum of the layers' best times was within 1.3% of the best of all eight at batch 1 and 0.2% at batches
#: 8, 32 and 128 (single layers: up to 20% at batch 1, 3% at the larger batches); the best three tiles for every
#: size at once lost 6% at one of those batches.
TILE_ORDERS = {
    "narrow": ((128, 64, 64, 4, 4), (128, 64, 128, 4, 3), (128, 64, 64, 4, 2), (64, 64, 128, 4, 3),
               (64, 64, 64, 4, 3), (64, 128, 128, 4, 3), (128, 128, 128, 4, 3), (128, 128, 64, 4, 3)),
    "small": ((64, 128, 128, 4, 3), (64, 64, 128, 4, 3), (128, 64, 128, 4, 3), (64, 64, 64, 4, 3),
              (128, 64, 64, 4, 4), (128, 64, 64, 4, 2), (128, 128, 128, 4, 3), (128, 128, 64, 4, 3)),
    "medium": ((128, 64, 64, 4, 2), (128, 128, 128, 4, 3), (64, 128, 128, 4, 3), (128, 128, 64, 4, 3),
               (128, 64, 128, 4, 3), (128, 64, 64, 4, 4), (64, 64, 128, 4, 3), (64, 64, 64, 4, 3)),
    "large": ((128, 128, 128, 4, 3), (128, 128, 64, 4, 3), (64, 128, 128, 4, 3), (128, 64, 128, 4, 3),
              (128, 64, 64, 4, 4), (128, 64, 64, 4, 2), (64, 64, 128, 4, 3), (64, 64, 64, 4, 3)),
}
#: Kernels compiled per MatrixMultiply (a 1x1 convolution over its rows, see triton_matmul_candidates): larger tiles
#: and deeper pipelines than a convolution's, for K of 768 to 3072.
GEMM_TILES = ((128, 128, 128, 4, 3), (128, 256, 128, 8, 3), (256, 128, 128, 8, 3), (128, 128, 128, 8, 4),
              (128, 64, 128, 4, 4), (64, 128, 128, 4, 4), (128, 256, 64, 8, 4), (128, 128, 64, 4, 4),
              (128, 128, 256, 4, 3), (128, 128, 128, 4, 4))
#: Grids each kernel is timed with: programs per SM (a persistent kernel), or 0 for one program per tile.
GRIDS = (0, 1, 2, 4)
_SOURCE = "tftrt_py.engine.backends.cupy.triton.quantized_conv"
_I32 = 2 ** 31
#: Triton's type of an operand of each format the kernel runs (E4M3 bytes are stored as uint8 here; FP16: fp16
#: operands summed in fp32, as FP8's, with the float epilogue).
QUANTIZED_POINTERS = {"INT8": "*i8", "FP8": "*fp8e4nv", "FP16": "*fp16"}
_FLOATS = ("float16", "float32")
#: The kernel's ACT code of each activation type it applies. GELU is computed in the tanh form (the erf GELU too), as
#: cuBLASLt's epilogue computes it for FP16 engines (cublaslt.REDUCED_GELU).
ACTIVATIONS = {None: 0, "relu": 1, "gelu_tanh": 2}


def activation_code(activation) -> Optional[int]:
    kind = (activation or {}).get("type")
    return ACTIVATIONS.get(REDUCED_GELU.get(kind, kind))


def pointer_type(dtype: str, fmt: str) -> str:
    return {"int8": "*i8", "uint8": QUANTIZED_POINTERS[fmt], "float16": "*fp16", "float32": "*fp32"}[dtype]


def fits(geom: ConvGeom, activation, residual) -> bool:
    """The convolutions the kernel covers: 2-d, ungrouped, undilated, padding of zero or more (the kernel reads
    only the padding before: the output size bounds the rest, so TF's SAME stride-2 padding of 0 before and 1
    after fits), channels a multiple of 32 (or of 4 below 32: a stem), int32 offsets, an activation of
    ACTIVATIONS or none, a residual of the output's batch."""
    return (len(geom.spatial) == 2 and geom.groups == 1 and geom.dilations == (1, 1)
            and min(geom.pre + geom.post) >= 0 and geom.c % (32 if geom.c >= 32 else 4) == 0
            and geom.n * int(np.prod(geom.spatial)) * geom.c < _I32 and geom.rows * geom.cout < _I32
            and activation_code(activation) is not None and (residual is None or residual[0] == geom.n))


def pixel_pairs(fmt: str, geom: ConvGeom) -> ConvGeom:
    """The geometry the kernel runs `geom` (one it fits) in: an INT8 image of 4 channels read with stride 2 along W
    (a stem the quantize step did not fold) as W/2 pixels of 8 channels (conv_fold.WIDTH: each pair of neighbours,
    the same bytes), each tap reading 8 contiguous bytes instead of 4 (the 7x7/2 stem of ResNet-50 at batch 128:
    0.184 ms instead of 0.258 on an H100). Other geometries and FP8 (conv_fold says why) are returned as they are."""
    return conv_fold.fold(geom, conv_fold.WIDTH) if fmt == "INT8" and conv_fold.foldable(geom, conv_fold.WIDTH) \
        else geom


def kernel_tile(geom: ConvGeom, tile) -> Tuple[int, ...]:
    """The (BM, BN, BK, warps, stages) `tile` compiles for this convolution: BK bytes of channels a step where
    they divide the channels (or a stem's whole filter taps), else 64 or 32."""
    bm, bn, bk, warps, stages = tile[:5]
    if geom.c >= 32 and geom.c % bk:
        bk = 64 if geom.c % 64 == 0 else 32
    return bm, bn, bk, warps, stages


def size_class(geom: ConvGeom, sms: int) -> str:
    """The TILE_ORDERS class of a convolution on a GPU of `sms` multiprocessors."""
    if geom.cout <= 64:
        return "narrow"
    waves = -(-geom.rows // 128) * -(-geom.cout // 128) / max(sms, 1)
    return "small" if waves < 1 else "medium" if waves < 4 else "large"


def conv_tiles(geom: ConvGeom, sms: int, count: int) -> Tuple[Tuple[int, ...], ...]:
    """The first `count` distinct kernels (kernel_tile) of TILES in the order of this convolution's size class."""
    preferred = TILE_ORDERS[size_class(geom, sms)]
    order = [t for t in preferred if t in TILES] + [t for t in TILES if t not in preferred]
    return tuple(dict.fromkeys(kernel_tile(geom, t) for t in order))[:count]


def clamps_in_fp16(fmt: str, out_scale: Optional[float]) -> bool:
    """Whether the kernel clamps int8 outputs of this scale in fp16 (its _requantize): 127 times the scale a normal
    fp16 value (up to 65000: its fp16 rounding stays finite)."""
    return fmt == "INT8" and out_scale is not None and 2.0 ** -14 <= 127 * float(out_scale) <= 65000.0


def epilogue_codes(residual: Optional[Tuple[int, str]], residual_scaled: bool, out_dtype: str, dual: bool
                   ) -> Tuple[int, int]:
    """The kernel's RES and OUT codes (triton/quantized_conv.py) of an epilogue: residual none (0), float (1),
    quantized (2) or float rounded to its quantized grid (3); output float (0), quantized (1) or both (2)."""
    out = (2 if dual else 0) if out_dtype in _FLOATS else 1
    res = 0 if residual is None else 2 if residual[1] not in _FLOATS else 3 if residual_scaled else 1
    return res, out


def small_sums(fmt: str, geom: ConvGeom) -> bool:
    """Whether the kernel's int8 sums of this convolution stay below 2**22 in magnitude (K * 127 * 127 does), so
    they are summed from _OFFSET (triton/quantized_conv.py's SMALL_SUMS)."""
    return fmt == "INT8" and geom.ksize * geom.c * 127 * 127 < 2 ** 22


def kernel_request(fmt: str, geom: ConvGeom, has_bias: bool, activation, residual: Optional[Tuple[int, str]],
                   residual_scaled: bool, out_dtype: str, dual: bool, tile, capability: int,
                   out_scale: Optional[float] = None):
    """The Triton compile request of one tile for this `fmt` ("INT8" or "FP8") convolution and epilogue
    (triton.request); `out_scale`: the scale of the quantized output it writes, if any."""
    bm, bn, bk, warps, stages = kernel_tile(geom, tile)
    q = QUANTIZED_POINTERS[fmt]
    res, out = epilogue_codes(residual, residual_scaled, out_dtype, dual)
    params = {"x": q, "w": q, "dq": "*fp32", "bias": "*fp32",
              "res": pointer_type(residual[1] if residual else "float16", fmt), "y": pointer_type(out_dtype, fmt),
              "yq": q, "M": "i32", "res_scale": "fp32", "inv_out": "fp32"}
    (kh, kw), (sh, sw), (ph, pw) = geom.kernel, geom.strides, geom.pre
    (h, w), (oh, ow) = geom.spatial, geom.out
    constexprs = dict(C=geom.c, COUT=geom.cout, H=h, W=w, OH=oh, OW=ow, KH=kh, KW=kw, SH=sh, SW=sw, PH=ph, PW=pw,
                      HAS_BIAS=bool(has_bias), RES=res, ACT=activation_code(activation), OUT=out, FP8=fmt != "INT8",
                      BM=bm, BN=bn, BK=bk, GROUP=8, SMALL_C=geom.c if geom.c < 32 else 0,
                      SMALL_SUMS=small_sums(fmt, geom),
                      CLAMP16=out != 0 and clamps_in_fp16(fmt, out_scale))
    return triton.request(_SOURCE, "conv_quantized", params, constexprs, capability, num_warps=warps,
                          num_stages=stages)


def _request(fmt: str, geom: ConvGeom, deq: Dequant, residual, tile, capability: int):
    return kernel_request(fmt, geom, deq.bias is not None, deq.activation, residual, deq.res_scale is not None,
                          deq.out_dtype, deq.dual_scale is not None, tile, capability, deq.requant_scale)


def prefetch_requests(convolutions, count: int, tiles=None) -> list:
    """The compile requests of these convolutions' kernels (for triton.prefetch): `tiles` each, or by default the
    `count` of conv_tiles; a job is (format, geom, has bias, activation, residual (batch, dtype) or None, residual
    scaled, output dtype, the scale of the quantized values it writes or None, whether it writes a quantized copy
    beside a float output), those the kernel fits; none where Triton is missing (not imported when there is
    nothing to compile: an FP16 build has no quantized convolutions, and importing Triton costs about 0.2 s)."""
    if not convolutions or not triton.available():
        return []
    device = _device.require().cuda.Device()
    capability, sms = int(device.compute_capability), device.attributes["MultiProcessorCount"]
    requests = []
    for fmt, geom, bias, act, residual, scaled, out, out_scale, dual in convolutions:
        if not fits(geom, act, residual):
            continue
        geom = pixel_pairs(fmt, geom)
        requests += [kernel_request(fmt, geom, bias, act, residual, scaled, out, dual, tile, capability, out_scale)
                     for tile in (tiles or conv_tiles(geom, sms, count))]
    return requests


@dataclasses.dataclass(frozen=True)
class ConvOperands:
    """What the kernel runs one convolution with: its format ("INT8", "FP8" or "FP16"), geometry (as the kernel
    runs it: a folded stem folded), weights [Cout, *K, C] on the device, epilogue (quant.Dequant or FloatEpilogue)
    and residual (batch, dtype) or None."""

    fmt: str
    geom: ConvGeom
    w: object
    deq: object
    residual: Optional[Tuple[int, str]]


#: Format -> the ConvOperands of a convolution's Spec in that format, or None where the kernel does not run it
#: (registered by int8.py, fp8.py and, for FP16, this module): one source of the weights and epilogue a layer's
#: kernels run with, alone or chained (conv_chain.py).
OPERANDS: Dict[str, Callable[[Spec], Optional[ConvOperands]]] = {}


def conv_operands(spec: Spec) -> Optional[ConvOperands]:
    """The ConvOperands of a convolution's spec: quantized in its plan's format, else FP16 (float16 in and out);
    None for any other."""
    fmt = spec.quant.get("format", "INT8") if spec.quant is not None else "FP16"
    make = OPERANDS.get(fmt)
    return make(spec) if make is not None and spec.layer.kind == "Convolution" else None


class TritonConvOp(Op):
    """One compiled kernel of the Triton int8 or FP8 convolution, launched with one grid."""

    def __init__(self, fmt: str, geom: ConvGeom, w, deq: Dequant, kernel, tile, sms: int):
        bm, bn, _, _, _, per_sm = tile
        self.w, self.deq, self.kernel = w, deq, kernel
        self.scalars = [np.int32(geom.rows)] + [
            np.float32(deq.res_scale or 1.0), np.float32(1.0) / np.float32(deq.requant_scale or 1.0)]
        tiles = -(-geom.rows // bm) * -(-geom.cout // bn)
        self.grid = min(tiles, per_sm * sms) if per_sm else tiles
        self.device_bytes = int(w.nbytes) + deq.nbytes
        self.tactic = {"op": f"triton_conv_{fmt.lower()}", "tile": list(tile)}

    def run(self, rc, ins, outs):
        d = self.deq
        ptr = [ins[0].data.ptr, self.w.data.ptr, d.dq.data.ptr, d.bias.data.ptr if d.bias is not None else 0,
               ins[1].data.ptr if len(ins) > 1 else 0, outs[0].data.ptr, outs[1].data.ptr if len(outs) > 1 else 0]
        self.kernel.launch(self.grid, [np.uint64(p) for p in ptr] + self.scalars)


def triton_conv_candidates(fmt: str, geom: ConvGeom, w, deq: Dequant, residual: Optional[Tuple[int, str]],
                           prefer: dict, count: int, tiles=None) -> List[Op]:
    """Each kernel of `tiles` (by default the `count` of conv_tiles; prefetched, or compiled side by side here) with
    each distinct grid of GRIDS, or the recorded tile when it is one of TILES's (or of `tiles`) with a grid of GRIDS
    (a plan's other values are not compiled); none where Triton is missing or the convolution does not fit."""
    if not triton.available() or not fits(geom, deq.activation, residual):
        return []
    paired = pixel_pairs(fmt, geom)
    if paired is not geom:
        w = _device.require().asarray(conv_fold.fold_weights(w.get(), geom, conv_fold.WIDTH))
        geom = paired
    device = _device.require().cuda.Device()
    capability, sms = int(device.compute_capability), device.attributes["MultiProcessorCount"]
    recorded = prefer.get("tile")
    known = {kernel_tile(geom, t) + (g,) for t in (tiles or TILES) for g in GRIDS}
    if isinstance(recorded, list) and tuple(recorded) in known:
        tiles = [tuple(recorded)]
    else:
        tiles = [kernel_tile(geom, t) + (g,) for t in (tiles or conv_tiles(geom, sms, count)) for g in GRIDS]
        tiles = list(dict.fromkeys(tiles))
    kernels = {t[:5]: None for t in tiles}

    def build(tile):
        try:
            return triton.compile_kernel(_request(fmt, geom, deq, residual, tile, capability))
        except Exception as exc:  # a tile Triton cannot compile for this GPU
            logger.debug("Triton %s convolution, tile %s: %s", fmt, tile, exc)
            return None

    with concurrent.futures.ThreadPoolExecutor(len(kernels)) as pool:
        kernels = dict(zip(kernels, pool.map(build, kernels)))
    ops = {}  # a grid of more programs than tiles launches one a tile, as grid 0 does: timed once
    for t in tiles:
        if kernels[t[:5]]:
            op = TritonConvOp(fmt, geom, w, deq, kernels[t[:5]], t, sms)
            ops.setdefault((t[:5], op.grid), op)
    return list(ops.values())


@dataclasses.dataclass(frozen=True)
class FloatEpilogue:
    """The epilogue of an FP16 convolution in the kernel: per-channel factors of 1 (nothing to dequantize), bias,
    activation, a float residual as it is, a float16 output."""

    dq: object
    bias: object
    activation: Optional[dict]
    out_dtype: str = "float16"
    res_scale = None
    dual_scale = None
    requant_scale = None

    @property
    def nbytes(self) -> int:
        return int(self.dq.nbytes) + (int(self.bias.nbytes) if self.bias is not None else 0)


def fp16_conv_operands(spec: Spec, geom: Optional[ConvGeom] = None) -> Optional[ConvOperands]:
    """The ConvOperands of an FP16 convolution (float16 in and out, 32 channels or more) the kernel fits; `geom`:
    its geometry, where the caller has it."""
    layer = spec.layer
    geom = geom or ConvGeom.of(layer, spec.in_shapes[0], spec.out_shapes[0])
    residual = (spec.in_shapes[1][0], spec.in_dtypes[1]) if len(spec.in_shapes) > 1 else None
    activation = layer.params.get("activation")
    if (not triton.available() or geom.c < 32 or spec.in_dtypes[0] != "float16" or spec.out_dtypes[0] != "float16"
            or not fits(geom, activation, residual)):
        return None
    cupy = _device.require()
    bias = layer.weights.get("bias")
    w = cupy.asarray(np.ascontiguousarray(np.moveaxis(layer.weights["kernel"], -1, 0)).astype(np.float16))
    deq = FloatEpilogue(cupy.ones(geom.cout, np.float32),
                        cupy.asarray(bias.astype(np.float32)) if bias is not None else None, activation)
    return ConvOperands("FP16", geom, w, deq, residual)


OPERANDS["FP16"] = fp16_conv_operands


def fp16_conv_candidates(spec: Spec, geom: ConvGeom) -> List[Op]:
    """The kernel's tiles as an FP16 convolution (float16 in and out; products summed in fp32 on the tensor
    cores), timed beside cuDNN's plans: memory bounds ResNet-50's 1x1 convolutions with a residual at batch 128,
    and cuDNN's run them at about half their DRAM rate on an H200 (docs/performance). BK is capped at 64
    elements (128 bytes, as the quantized kernels' widest step)."""
    prefer = spec.prefer or {}
    operands = fp16_conv_operands(spec, geom) if prefer.get("op") in (None, "triton_conv_fp16") else None
    if operands is None:
        return []
    sms = _device.require().cuda.Device().attributes["MultiProcessorCount"]
    tiles = dict.fromkeys((bm, bn, min(bk, 64), warps, stages)
                          for bm, bn, bk, warps, stages in conv_tiles(geom, sms, spec.options.triton_tiles))
    return triton_conv_candidates("FP16", operands.geom, operands.w, operands.deq, operands.residual, prefer,
                                  spec.options.triton_tiles, list(tiles))


FLOAT16_FACTORIES.append(fp16_conv_candidates)


def gemm_geom(rows: int, k: int, n: int) -> ConvGeom:
    """A GEMM [rows, k] x [k, n] as the 1x1 convolution the kernel runs it as (rows pixels of k channels)."""
    return ConvGeom(rows, (1, 1), k, n, (1, 1), 1, (1, 1), (1, 1), (0, 0), (0, 0), (1, 1))


def gemm_operands(quant: dict, params: dict, out_shape) -> Optional[Tuple[int, int, int, np.ndarray]]:
    """(rows, padded K, N, quantized weights [N, Kp]) of a quantized MatrixMultiply the kernel serves (`quant`:
    program.quant_plan's): an activation A [.., M, K] (not transposed) times a constant 2-d B with one scale per
    column; None for other products."""
    b = quant["b"]["const"]
    if (quant["a"]["const"] is not None or b is None or params.get("transpose_a") or np.ndim(quant["dq"]) != 1
            or b.size != b.shape[-2] * b.shape[-1]):
        return None
    n, kp = b.shape[-2:]
    return int(np.prod(out_shape[:-1])), kp, n, b.reshape(n, kp)


def triton_matmul_candidates(fmt: str, spec, deq: Dequant) -> List[Op]:
    """The kernel's GEMM_TILES as a quantized MatrixMultiply (gemm_operands; its epilogue `deq`): dequantize, bias,
    activation and the output's requantization in the GEMM, where cuBLAS(Lt) write int32 or fp32 sums for an
    epilogue pass. None where the product does not fit."""
    operands = gemm_operands(spec.quant, spec.params, spec.out_shapes[0])
    if (operands is None or (spec.prefer or {}).get("op") not in (None, f"triton_gemm_{fmt.lower()}")
            or settings.GEMM.get() not in (None, "triton")):  # tests: only this path, or another
        return []
    rows, kp, n, w = operands
    ops = triton_conv_candidates(fmt, gemm_geom(rows, kp, n), _device.require().asarray(w), deq, None,
                                 spec.prefer or {}, len(GEMM_TILES), GEMM_TILES)
    for op in ops:
        op.tactic["op"] = f"triton_gemm_{fmt.lower()}"
    return ops
