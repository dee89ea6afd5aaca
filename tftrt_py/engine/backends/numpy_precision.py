"""FP16, INT8 and FP8 layers on the numpy backend, computed the way the GPU computes them, so that accuracy
measured on the CPU predicts accuracy on the GPU.

* FP16: float inputs and weights are rounded to fp16, the layer's fp32 kernel runs on them (fp32
  accumulation), float outputs are rounded to fp16 (kept in the tensor's dtype: they hold fp16 values).
* INT8 (Convolution, MatrixMultiply): activations are quantized with their tensor's scale
  (dynamic range / 127, round half to even, clamp to [-127, 127]), constant weights per output channel
  (max abs / 127); the integer products are summed exactly (TensorRT's int32 accumulation; the sums are
  carried in float64, exact for integers below 2**53, so BLAS does the work), dequantized, then bias,
  residual and activation apply in fp32 and the output is rounded to fp16. A convolution's residual with a
  range is read quantized too (TensorRT's int8 residual): rounded to its tensor's int8 grid.
* FP8 (Convolution, MatrixMultiply): as INT8 with E4M3FN values instead of integers: scales range / 448 per
  tensor and max abs / 448 per output channel, values rounded to E4M3 (:func:`round_e4m3`: nearest, ties
  to even, saturated to +-448); the products are exact in fp32 and summed in fp32 (the GPU's accumulation);
  a convolution's residual with a range is rounded to its E4M3 grid.
* INT8 and FP8 Attention: q, k and v are each quantized as activations are above (a tensor read as several of
  them, windows of a fused QKV projection, once) and dequantized (q x s, fp32); the attention then runs as in
  FP32 (scores, mask, softmax and the product with v in fp32; the bool mask read as it is) and its output is
  rounded to fp16.
"""
from __future__ import annotations

import dataclasses
import weakref
from typing import Callable, Dict, List, Tuple

import numpy as np

from tftrt_py.engine.errors import BackendError
from tftrt_py.engine.quantization import FORMATS, quantize, quantize_per_channel, round_fp16
from tftrt_py.engine.reference import KERNELS, apply_activation, conv_sums

__all__ = ["run", "cached"]

_CACHE: Dict[tuple, Tuple[object, object]] = {}  # (id(owner), key..) -> (weakref to owner, what was made)


def cached(owner, make: Callable, key: tuple = ()):
    """What `make(owner)` returns (arrays: nothing that refers back to `owner`), computed once per `owner` (a layer,
    a weight array) and `key` while `owner` lives."""
    k = (id(owner),) + tuple(key)
    entry = _CACHE.get(k)
    if entry is None or entry[0]() is not owner:
        entry = (weakref.ref(owner), make(owner))
        _CACHE[k] = entry
        weakref.finalize(owner, _CACHE.pop, k, None)
    return entry[1]


# -- FP16 ----------------------------------------------------------------------------------------------------
def _fp16_weights(layer) -> Dict[str, np.ndarray]:
    return {k: round_fp16(v) if v.dtype != np.float16 else v.astype(np.float32) for k, v in layer.weights.items()}


def _run_fp16(fn: Callable, layer, inputs: List[np.ndarray]) -> List[np.ndarray]:
    rounded = dataclasses.replace(layer, weights=cached(layer, _fp16_weights))
    outs = fn(rounded, [round_fp16(np.asarray(a)) for a in inputs])
    return [round_fp16(np.asarray(o)) for o in outs]


# -- INT8 and FP8 ----------------------------------------------------------------------------------------------
def _activation_operand(layer, i: int, value: np.ndarray) -> Tuple[np.ndarray, object]:
    t = layer.inputs[i]
    if t.dynamic_range is None:
        raise BackendError(f"{layer.precision} layer {layer.name!r}: its input {t.name!r} has no dynamic range")
    return quantize(value, t.dynamic_range, FORMATS[layer.precision])


def _epilogue(layer, out: np.ndarray, residual=None) -> List[np.ndarray]:
    """Bias, residual and activation in fp32, then the output rounded to fp16."""
    out = out.astype(np.float32)
    bias = layer.weights.get("bias")
    if bias is not None:
        out = out + bias.astype(np.float32)
    if residual is not None:
        out = out + residual.astype(np.float32)
    out = apply_activation(out, layer.params.get("activation"))
    return [round_fp16(out).astype(layer.outputs[0].dtype, copy=False)]


def _sums(layer, a: np.ndarray, b: np.ndarray, fn: Callable) -> np.ndarray:
    """fn(a, b) of quantized operands in their format's sum dtype, as float64."""
    dtype = FORMATS[layer.precision].sum_dtype
    return np.asarray(fn(a.astype(dtype, copy=False), b.astype(dtype, copy=False)), np.float64)


def _residual(layer, inputs):
    """An INT8 or FP8 convolution's residual, rounded to its quantized grid when it has a range (TensorRT's int8
    residual input): int8 clamp(rint(r / s), -127, 127) * s, or the E4M3 value of r / s times s, in fp32."""
    if len(inputs) < 2:
        return None
    r, amax = inputs[1], layer.inputs[1].dynamic_range
    if layer.precision not in FORMATS or amax is None:
        return r
    q, s = quantize(r, amax, FORMATS[layer.precision])
    return q.astype(np.float32) * np.float32(s)


def _quantized_convolution(layer, inputs):
    qx, sx = _activation_operand(layer, 0, inputs[0])
    qk, sk = cached(layer, lambda l: quantize_per_channel(l.weights["kernel"], -1, FORMATS[l.precision]),
                    (layer.precision,))
    sums = _sums(layer, qx, qk, lambda x, k: conv_sums(x, k, layer.params))
    return _epilogue(layer, sums * (sx * sk.reshape(-1)), _residual(layer, inputs))


def _matmul_weights(layer):
    """Per-channel quantized constant operands: A per row (its output rows), B per column."""
    p, prepared = layer.params, {}
    for i, (flag, axis) in enumerate((("transpose_a", -2), ("transpose_b", -1))):
        t = layer.inputs[i]
        if t.producer is not None and t.producer.kind == "Constant":
            w = t.producer.weights["value"]
            prepared[i] = quantize_per_channel(np.swapaxes(w, -1, -2) if p.get(flag) else w, axis,
                                               FORMATS[layer.precision])
    return prepared


def _quantized_matmul(layer, inputs):
    p = layer.params
    weights = cached(layer, _matmul_weights)
    operands = []
    for i, flag in enumerate(("transpose_a", "transpose_b")):
        if i in weights:
            operands.append(weights[i])
            continue
        value = np.swapaxes(inputs[i], -1, -2) if p.get(flag) else inputs[i]
        operands.append(_activation_operand(layer, i, value))
    (qa, sa), (qb, sb) = operands
    return _epilogue(layer, _sums(layer, qa, qb, np.matmul) * sa * sb)


def _dequantized(layer, inputs) -> List[np.ndarray]:
    """q, k and v at their quantized values (fp32), each distinct input tensor quantized once; the mask as it is."""
    values: Dict[int, np.ndarray] = {}
    for i, t in enumerate(layer.inputs[:3]):
        if id(t) not in values:
            q, s = _activation_operand(layer, i, inputs[i])
            values[id(t)] = q.astype(np.float32) * np.float32(s)
    return [values[id(t)] for t in layer.inputs[:3]] + inputs[3:]


def _quantized_attention(layer, inputs):
    out = KERNELS["Attention"](layer, _dequantized(layer, inputs))[0]
    return [round_fp16(out)]


#: Layer kinds that run quantized (INT8, FP8); the others of such engines run in FP16.
QUANTIZED_KERNELS = {"Convolution": _quantized_convolution, "MatrixMultiply": _quantized_matmul,
                     "Attention": _quantized_attention}


def run(fn: Callable, layer, inputs: List[np.ndarray]) -> List[np.ndarray]:
    """Outputs of `layer` (precision FP16, INT8 or FP8) whose fp32 numpy kernel is `fn`."""
    if layer.precision in FORMATS:
        kernel = QUANTIZED_KERNELS.get(layer.kind)
        if kernel is None:
            raise BackendError(f"layer {layer.name!r}: no {layer.precision.lower()} kernel for layer kind "
                               f"{layer.kind!r} on backend 'numpy' (quantized kinds: {', '.join(QUANTIZED_KERNELS)})")
        return kernel(layer, [np.asarray(a) for a in inputs])
    return _run_fp16(fn, layer, inputs)
