"""INT8 Convolution and MatrixMultiply layers on ONNX Runtime's integer kernels, quantized as the numpy backend
does (numpy_precision): activations symmetric per tensor (scale = dynamic range / 127), constant weights per
output channel; the int32 sums are exact, then scaled, biased and activated in fp32.

The int8 values travel as uint8 with zero point 128 (QuantizeLinear, ConvInteger, MatMulInteger): ONNX Runtime's
u8 x u8 kernels sum exactly on every x86 CPU, where its u8 x s8 ones (what QDQ convolutions and matmuls become)
saturate int16 pair sums without VNNI, and its QDQ convolution fusion needs the output quantized too, which the
numpy and cupy backends do not do. Values below -127.5 scales quantize to -128 here, to -127 on numpy.
"""
from __future__ import annotations

from typing import Callable, Dict

import numpy as np

from tftrt_py.engine.backends.numpy_precision import _scale, quantize_per_channel
from tftrt_py.engine.backends.onnxruntime import nn
from tftrt_py.engine.backends.onnxruntime.graph import Graph
from tftrt_py.engine.backends.onnxruntime.pointwise import activation
from tftrt_py.engine.backends.onnxruntime.registry import weight
from tftrt_py.engine.errors import BackendError

__all__ = ["INT8_LOWERINGS"]

#: layer kind -> lowering of its INT8 layers
INT8_LOWERINGS: Dict[str, Callable] = {}

#: The zero point that carries int8 values as uint8.
ZERO = 128


def _int8(kind: str):
    def wrap(fn):
        INT8_LOWERINGS[kind] = fn
        return fn

    return wrap


def _quantized(g: Graph, layer, i: int, x: str):
    """(activation `x` of input `i` as uint8 around 128, its scale)."""
    t = layer.inputs[i]
    if t.dynamic_range is None:
        raise BackendError(f"INT8 layer {layer.name!r}: its input {t.name!r} has no dynamic range")
    scale = _scale(t.dynamic_range)
    return g.node("QuantizeLinear", [x, g.scalar(scale, np.float32), g.scalar(ZERO, np.uint8)]), scale


def _weight(g: Graph, q: np.ndarray) -> str:
    """int8 values `q` (held in floats) as a uint8 initializer around 128."""
    return g.const(q + ZERO, np.uint8)


@_int8("Convolution")
def _convolution(g, layer, ins):
    p = layer.params
    nsp = layer.weights["kernel"].ndim - 2
    x, sx = _quantized(g, layer, 0, nn.to_channels_first(g, ins[0], nsp))
    q, sw = quantize_per_channel(nn.onnx_kernel(layer), axis=0)
    zero = g.scalar(ZERO, np.uint8)
    sums = g.node("ConvInteger", [x, _weight(g, q), zero, zero], kernel_shape=list(q.shape[2:]),
                  strides=p["strides"], dilations=p["dilations"], pads=p["pre_padding"] + p["post_padding"],
                  group=p.get("groups", 1))
    channel = [1, -1] + [1] * nsp
    out = g.node("Mul", [g.cast(sums, "int32", "float32"), g.const((sx * sw).reshape(channel), np.float32)])
    if "bias" in layer.weights:
        out = g.node("Add", [out, g.const(weight(layer, "bias").reshape(channel), np.float32)])
    out = nn.to_channels_last(g, out, nsp)
    if len(ins) > 1:
        out = g.node("Add", [out, ins[1]])
    return [activation(g, out, p.get("activation"), np.float32)]


@_int8("MatrixMultiply")
def _matmul(g, layer, ins):
    """Constant operands int8 per output channel (rows of A, columns of B), the others per tensor."""
    operands, scale = [], np.float64(1)
    for i, (x, flag, axis) in enumerate(zip(ins, ("transpose_a", "transpose_b"), (-2, -1))):
        t = layer.inputs[i]
        if t.producer is not None and t.producer.kind == "Constant":
            w = weight(t.producer, "value")
            q, s = quantize_per_channel(np.swapaxes(w, -1, -2) if layer.params.get(flag) else w, axis=axis)
            operands.append(_weight(g, q))
        else:
            x, s = _quantized(g, layer, i, nn.swap_last(g, x, t.rank) if layer.params.get(flag) else x)
            operands.append(x)
        scale = scale * s
    zero = g.scalar(ZERO, np.uint8)
    sums = g.node("MatMulInteger", operands + [zero, zero])
    out = g.node("Mul", [g.cast(sums, "int32", "float32"), g.const(scale, np.float32)])
    return [nn.matmul_epilogue(g, layer, out)]
