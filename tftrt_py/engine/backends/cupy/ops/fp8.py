"""FP8 (E4M3) Convolution and MatrixMultiply on the cupy backend, and which GPUs may build them.

The contract is INT8's (ops/quant.py) with E4M3FN values for integers (numpy_precision.py computes the same
on the CPU): an activation operand is quantized with its tensor's scale dynamic_range / 448, rounded to
nearest even and saturated to +-448 (``cvt.rn.satfinite.e4m3x2.f32``, one kernel step shared by every FP8
reader of a tensor: quant.QuantizeOp with quant.E4M3_Q); constant weights per output channel (max abs / 448);
products summed in fp32, then ``act(sum * s_x * s_w[c] + bias + residual)`` in fp32, written as fp16.

* Convolution: our Triton kernel (triton_conv.py, int8's with E4M3 operands and fp32 sums), which also reads
  and writes E4M3 tensors between FP8 layers and quantized residuals, and runs a stem on its image folded by 2x2
  pixel blocks with NaN pixels flagged (conv_fold.py); a cuDNN graph (E4M3 image and filter, fp32
  accumulation) with the per-channel dequantize, bias, residual and activation fused on its output (int8's graph
  with FP8 operands); where neither serves (a quantized output or residual without Triton), cuDNN's graph
  writing fp32 sums and the epilogue kernel.
* MatrixMultiply: our Triton kernel as a GEMM (activations times constant weights: the whole epilogue inside, E4M3
  in and out between FP8 layers), or cuBLASLt's E4M3 GEMM writing fp32 sums (it takes one scale per operand),
  then the epilogue kernel (quant.Dequant) applies the per-channel scales, bias and activation.

E4M3 bytes are stored as uint8 (cupy has no float8 type). FP8 needs compute capability 8.9 or later (Ada,
Hopper): building an FP8 engine on an older GPU is a BuildError saying what to use instead.
"""
from __future__ import annotations

import logging
from typing import List, Optional, Tuple

import numpy as np

from tftrt_py import settings
from tftrt_py.engine.backends.cupy import _device
from tftrt_py.engine.backends.cupy.ops import conv_fold
from tftrt_py.engine.backends.cupy.ops.base import Op, Spec, register
from tftrt_py.engine.backends.cupy.ops.int8 import CudnnInt8ConvOp, LtInt8MatMulOp, _cudnn_int8_graph
from tftrt_py.engine.backends.cupy.ops.quant import (E4M3_Q, FP8, Dequant, QuantizeAfterOp, QuantizeOp,
                                                     matmul_dequant, out_scale)
from tftrt_py.engine.backends.cupy.ops.triton_conv import (OPERANDS, ConvOperands, triton_conv_candidates,
                                                           triton_matmul_candidates)
from tftrt_py.engine.errors import BuildError
from tftrt_py.engine.quantization import FORMATS, quantize_per_channel

__all__ = ["MIN_CAPABILITY", "check_device", "e4m3_bytes", "fp8_conv_candidates", "fp8_matmul_candidates",
           "matmul_constant"]

logger = logging.getLogger(__name__)

#: The oldest GPU generation with FP8 tensor cores (Ada Lovelace, sm_89).
MIN_CAPABILITY: Tuple[int, int] = (8, 9)


def _capability(text: str) -> Tuple[int, int]:
    """cupy's compute capability string ("90", "89", "100") as (major, minor)."""
    return int(text[:-1]), int(text[-1])


def check_device(engine_name: str, precision: str, capability: str, device: str) -> None:
    """BuildError when an FP8 engine is built on a GPU below compute capability 8.9."""
    if precision == "FP8" and _capability(capability) < MIN_CAPABILITY:
        raise BuildError(
            f"engine {engine_name!r}: precision FP8 needs a GPU of compute capability "
            f"{'.'.join(map(str, MIN_CAPABILITY))} or later (Ada, Hopper: L4, L40, H100, H200); {device} has "
            f"{'.'.join(map(str, _capability(capability)))}. Build with precision_mode='INT8' (same calibration) "
            f"or 'FP16' instead")


def e4m3_bytes(values: np.ndarray) -> np.ndarray:
    """The E4M3FN codes (uint8) of values that are E4M3 values already (numpy_precision.round_e4m3's; NaN gives
    0x7f): read off their float32 bits, the exponent less 120 and the top three mantissa bits, or below 2**-6 the
    count of subnormal steps of 2**-9 (a search of the 127 values took a BERT-base FP8 build 17 s)."""
    v = np.asarray(values, np.float32)
    magnitude = np.abs(v)
    bits = magnitude.view(np.uint32).astype(np.int64)
    normal = ((bits >> 23) - 120) << 3 | ((bits >> 20) & 7)
    small = magnitude < 2.0 ** -6  # False for NaN
    codes = np.where(small, np.rint(np.where(small, magnitude, 0) * 512).astype(np.int64), normal)
    codes = np.where(np.isnan(v), 0x7F, codes).astype(np.uint8)
    return codes | np.where(np.signbit(v), np.uint8(0x80), np.uint8(0))


def _per_channel(w: np.ndarray, axis: int) -> Tuple[np.ndarray, np.ndarray]:
    """(E4M3 codes, float32 scale per index of `axis`) of weights, as the numpy backend quantizes them."""
    q, s = quantize_per_channel(w, axis, FORMATS["FP8"])
    return e4m3_bytes(q), s.reshape(-1).astype(np.float32)


def matmul_constant(value: np.ndarray, role: str, transposed: bool, kp: int):
    """A constant matmul operand as E4M3 codes [.., rows, kp] and its float32 scale per row (see
    int8.matmul_constant: rows are M for `role` "a", N for "b")."""
    v = np.asarray(value, np.float32)
    k_last = (role == "a") != transposed
    q, s = _per_channel(v if k_last else np.swapaxes(v, -1, -2), -2)
    pad = kp - q.shape[-1]
    if pad:
        q = np.concatenate([q, np.zeros(q.shape[:-1] + (pad,), np.uint8)], axis=-1)
    return np.ascontiguousarray(q), s


def fp8_conv_operands(spec: Spec) -> Optional[ConvOperands]:
    """The ConvOperands of an FP8 convolution (its input folded by 2x2 pixel blocks where the plan says so,
    ops/conv_fold.py); None for a grouped one or a residual broadcast over the batch."""
    cupy = _device.require()
    layer, quant = spec.layer, spec.quant
    geom = conv_fold.network_geom(spec)
    has_residual = len(spec.in_shapes) > 1
    residual = (spec.in_shapes[1][0], spec.in_dtypes[1]) if has_residual else None
    if geom.groups != 1 or (residual is not None and residual[0] != geom.n):
        return None
    activation, bias = layer.params.get("activation"), layer.weights.get("bias")
    kernel = layer.weights["kernel"]
    q, s_w = _per_channel(kernel, -1)
    if geom.c > kernel.shape[-2]:
        q = np.concatenate([q, np.zeros(q.shape[:-2] + (geom.c - q.shape[-2], q.shape[-1]), np.uint8)], axis=-2)
    w = np.ascontiguousarray(np.moveaxis(q, -1, 0))  # [Cout, *K, C]
    if quant.get("folded"):
        w, geom = conv_fold.fold_weights(w, geom), conv_fold.fold(geom)
    out_dtype, dual, res_scale = spec.out_dtypes[0], quant.get("dual_scale"), quant.get("res_scale")
    deq = Dequant(cupy.asarray(np.float32(quant["in_scale"]) * s_w),
                  cupy.asarray(bias.astype(np.float32)) if bias is not None else None, activation, out_dtype,
                  out_scale(spec, FP8), residual[1] if residual else None,
                  np.float32(dual) if dual is not None else None, "float32",
                  np.float32(res_scale) if has_residual and res_scale is not None else None, FP8)
    return ConvOperands("FP8", geom, cupy.asarray(w), deq, residual)


OPERANDS["FP8"] = fp8_conv_operands


@register("Convolution", formats=("FP8",))
def fp8_conv_candidates(spec: Spec) -> List[Op]:
    """Our Triton kernel's tiles, the plans of cuDNN's FP8 graph with dequantize, bias, residual and activation
    fused (float outputs and residuals), or else cuDNN's graph writing fp32 sums and the epilogue kernel; none
    (the layer then runs in FP16) for grouped convolutions or where nothing serves. On a folded image each is
    followed by the step that writes NaN where the image's flagged pixels reach (conv_fold.NanWindowsOp)."""
    operands = fp8_conv_operands(spec)
    if operands is None:
        return []
    layer, opts, prefer = spec.layer, spec.options, spec.prefer or {}
    geom, w, deq, residual = operands.geom, operands.w, operands.deq, operands.residual
    activation, bias, out_dtype = layer.params.get("activation"), layer.weights.get("bias"), spec.out_dtypes[0]
    has_residual, dual = residual is not None, operands.deq.dual_scale
    force = settings.FP8_CONV.get()  # tests: only this path ("triton", "fused" or "conv")
    cands: List[Op] = []
    if prefer.get("op") in (None, "triton_conv_fp8") and force in (None, "triton"):
        cands += triton_conv_candidates("FP8", geom, w, deq, residual, prefer, opts.triton_tiles)
    fused = out_dtype != FP8.storage and deq.res_scale is None  # cuDNN's graph writes floats, adds floats
    for fusion in (("fused",) if fused else ()) + ("conv",):
        if (_device.cudnn_module() is None or prefer.get("op") not in (None, "cudnn_conv_fp8")
                or prefer.get("fusion") not in (None, fusion) or force not in (None, fusion)
                or (fusion == "conv" and cands)):  # "conv": only where nothing else serves
            continue
        try:
            graph = _cudnn_int8_graph(geom, fusion, bias is not None, residual, activation, out_dtype, opts,
                                      fp8=True)
            plans = graph.plans(opts.cudnn_plans, prefer.get("plan"), opts.cudnn_runtime_plans)
        except Exception as exc:
            logger.debug("cuDNN FP8 graph (%s) for %s not supported: %s", fusion, layer.name, exc)
            continue
        ops = [CudnnInt8ConvOp(graph, plan, w, deq, (geom.n, *geom.out, geom.cout), has_residual) for plan in plans]
        for op in ops:
            op.tactic = dict(op.tactic, op="cudnn_conv_fp8")
        if dual is not None and fusion == "fused":
            quantize = QuantizeOp(spec.out_shapes[0], out_dtype, dual, geom.cout, qfunc=E4M3_Q)
            ops = [QuantizeAfterOp(op, quantize) for op in ops]
        cands += ops
    if spec.quant.get("folded"):
        cands = [conv_fold.NanWindowsOp(op, conv_fold.network_geom(spec), spec.out_dtypes) for op in cands]
    return cands


class LtFp8MatMulOp(LtInt8MatMulOp):
    """The product through cuBLASLt's E4M3 GEMM: fp32 sums, then the dequantizing epilogue."""

    OPERANDS, ACC, FORMAT = "float8_e4m3", "float32", FP8


@register("MatrixMultiply", formats=("FP8",))
def fp8_matmul_candidates(spec: Spec) -> List[Op]:
    """Our Triton kernel's E4M3 GEMMs (triton_conv.triton_matmul_candidates) and cuBLASLt's first E4M3 GEMM
    algorithms for this product; none (the layer then runs in FP16) where neither has a kernel for it."""
    own = triton_matmul_candidates("FP8", spec, matmul_dequant(spec, FP8, "float32"))
    prefer = spec.prefer or {}
    if prefer.get("op") not in (None, "cublaslt_gemm_fp8") or settings.GEMM.get() == "triton":
        return own
    try:
        first = LtFp8MatMulOp(spec, 0)
        ops = [first] + [LtFp8MatMulOp(spec, i, first.plan) for i in range(1, len(first.plan.algos))]
    except Exception as exc:
        logger.debug("no cuBLASLt FP8 GEMM for %s: %s", spec.layer.name, exc)
        return own
    return own + [op for op in ops if prefer.get("plan") in (None, op.algo)]
