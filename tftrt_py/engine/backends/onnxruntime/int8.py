"""INT8 Convolution, MatrixMultiply and Attention layers, quantized as the numpy backend does (numpy_precision):
activations symmetric per tensor (scale = dynamic range / 127, values clipped to +-127), constant weights per
output channel; sums exact (or, in fp32 convolutions of dequantized values, within fp32 rounding), then bias,
residual (rounded to its int8 grid where it has a range) and activation in fp32.

Convolutions take the fast path of ONNX Runtime's CPU, QLinearConv on uint8 activations and int8 weights
(MLAS's u8 x s8 kernels, about 2x an fp32 convolution on AVX2), where that is exact: activations that cannot be
negative (behind a relu, say: their int8 values 0..127 are their uint8 ones with zero point 0) and, for its
quantized output, a relu convolution without residual whose output only INT8 convolutions read. Without VNNI those
kernels sum pairs of products in int16 with saturation: 2 * 127 * 127 fits, 255 * 127 does not, hence the
clip of every uint8 form to 127 (numpy's clip). A tensor's uint8 form is made on demand (Graph.uint8): by its
producer's QLinearConv when it has one (its float form is then left unread and pruned), else quantized from its
float form. A 1x1 convolution's float output (a residual block's last, a projection) comes from the same u8 x s8
sums through MatMulIntegerToFloat (com.microsoft; scales and bias applied in its kernel) over channels-last pixels:
no layout changes between the QLinearConvs around it (an fp32 convolution there cost as much again in reorders;
Keras ResNet50 at batch 8: 288 -> 223 ms). Other convolutions run in fp32 on dequantized activations and weights
(exact values; ONNX Runtime's fused NCHWc convolution with residual and activation): ConvInteger is no faster
than fp32, QuantizeLinear -> QLinearConv saturates on signed activations. Signed activations go through
QuantizeLinear to int8, which gives -128 where numpy's clip gives -127 (values below -127.5 scales).

MatrixMultiply: A uint8 with zero point 128, B int8 where the CPU sums u8 x s8 exactly (VNNI, AMX), else uint8
with zero point 128 (exact u8 x u8 sums on every x86 CPU), through MatMulIntegerToFloat.

Attention: q, k and v fake-quantized as numpy quantizes them (once per distinct tensor: clipped to +-127 steps,
QuantizeLinear, times the scale in fp32), then the float lowering (nn.py) on those values. numpy divides by the
scale in float64, and an exact emulation in float64 ops (Cast, Div, Round, Clip) cost 4x as much for the rare
value QuantizeLinear's fp32 division rounds to the neighbouring step (two BERT-base layers at batch 8 on 2 CPUs:
50 ms, against 32 with QuantizeLinear and 26 with the attention in FP16).
"""
from __future__ import annotations

import functools
from typing import Callable, Dict, Optional

import numpy as np

from tftrt_py.engine.backends.onnxruntime import nn
from tftrt_py.engine.backends.onnxruntime.graph import CONTRIB, Graph, onnx_dtype
from tftrt_py.engine.backends.onnxruntime.pointwise import BIASED, biased_activation
from tftrt_py.engine.backends.onnxruntime.registry import LOWERINGS, weight
from tftrt_py.engine.errors import BackendError
from tftrt_py.engine.network import Layer, Tensor
from tftrt_py.engine.quantization import quantize_per_channel, scale as range_scale

__all__ = ["INT8_LOWERINGS", "EMULATED", "nonnegative"]

#: layer kind -> lowering of its INT8 layers
INT8_LOWERINGS: Dict[str, Callable] = {}

#: Kinds whose INT8 lowering only emulates the contract's rounding (no integer kernel does their work), so it is
#: never faster than FP16: non-strict engines run them in FP16 (backend.py).
EMULATED = ("Attention",)

#: The zero point that carries int8 values as uint8 in MatMulInteger.
ZERO = 128
#: numpy's int8 clip, and the largest uint8 activation MLAS's u8 x s8 pair sums hold exactly without VNNI.
QMAX = 127

#: Activations whose outputs are never negative.
NONNEGATIVE = ("relu", "relu6", "sigmoid", "hard_sigmoid", "softplus")


def _int8(kind: str):
    def wrap(fn):
        INT8_LOWERINGS[kind] = fn
        return fn

    return wrap


def _range_scale(t: Tensor, layer: Layer) -> float:
    if t.dynamic_range is None:
        raise BackendError(f"INT8 layer {layer.name!r}: its tensor {t.name!r} has no dynamic range")
    return range_scale(t.dynamic_range)


def _activation(layer: Layer) -> Optional[dict]:
    return layer.params if layer.kind == "Activation" else layer.params.get("activation")


def nonnegative(t: Tensor) -> bool:
    """Whether `t`'s producer makes only values >= 0 (or NaN): a non-negative activation, or pooling of such."""
    p = t.producer
    if p is None:
        return False
    if p.kind == "Pooling":
        return nonnegative(p.inputs[0])
    act = _activation(p) if p.kind in ("Activation", "Convolution", "MatrixMultiply", "Scale") else None
    return bool(act) and act.get("type") in NONNEGATIVE


def _clip(g: Graph, x: str) -> str:
    return g.node("Clip", [x, g.scalar(0, np.uint8), g.scalar(QMAX, np.uint8)])


def _uint8(g: Graph, t: Tensor, x: str, layer: Layer) -> str:
    """Non-negative `t` (float value `x`, channels-last) as uint8: zero point 0, its range's scale, <= 127."""
    made = g.uint8.get(t.name)
    if callable(made):
        made = made()
    if made is None:
        scale = _range_scale(t, layer)
        made = _clip(g, g.node("QuantizeLinear", [x, g.scalar(scale, np.float32), g.scalar(0, np.uint8)]))
    g.uint8[t.name] = made
    return made


def _kernel(layer: Layer):
    """(int8 values of the kernel in ONNX's layout, held in floats; scale per output channel, shape [Cout])."""
    q, scale = quantize_per_channel(nn.onnx_kernel(layer), axis=0)
    return q, scale.reshape(-1)


def _qlinear(g: Graph, layer: Layer, x_uint8: str) -> str:
    """The relu convolution on uint8 `x_uint8` as QLinearConv: its output quantized to uint8 at its range."""
    p, nsp = layer.params, layer.weights["kernel"].ndim - 2
    q, sw = _kernel(layer)
    sx, sy = _range_scale(layer.inputs[0], layer), _range_scale(layer.outputs[0], layer)
    ins = [nn.to_channels_first(g, x_uint8, nsp), g.scalar(sx, np.float32), g.scalar(0, np.uint8),
           g.const(q, np.int8), g.const(sw, np.float32), g.const(np.zeros(len(sw)), np.int8),
           g.scalar(sy, np.float32), g.scalar(0, np.uint8)]
    if "bias" in layer.weights:
        bias = np.rint(weight(layer, "bias").astype(np.float64) / (sx * sw.astype(np.float64)))
        ins.append(g.const(np.clip(bias, -2 ** 31, 2 ** 31 - 1), np.int32))
    y = g.node("QLinearConv", ins, kernel_shape=list(q.shape[2:]), strides=p["strides"], dilations=p["dilations"],
               pads=p["pre_padding"] + p["post_padding"], group=p.get("groups", 1))
    return _clip(g, nn.to_channels_last(g, y, nsp))


def _quantizes_output(layer: Layer) -> bool:
    """Whether `layer`'s output can be made as uint8 by QLinearConv: relu, no residual, a range known."""
    act = layer.params.get("activation")
    return (len(layer.inputs) == 1 and bool(act) and act["type"] == "relu"
            and layer.outputs[0].dynamic_range is not None)


def _pointwise(layer: Layer) -> bool:
    """Whether `layer` is a 1x1 convolution without padding or groups: a matrix multiply over channels-last pixels."""
    p, k = layer.params, layer.weights["kernel"]
    return (all(n == 1 for n in k.shape[:-2]) and p.get("groups", 1) == 1
            and not any(p["pre_padding"]) and not any(p["post_padding"]))


def _matmul_to_float(g: Graph, layer: Layer, x_uint8: str) -> str:
    """The 1x1 convolution on channels-last uint8 `x_uint8` as ONNX Runtime's MatMulIntegerToFloat (com.microsoft:
    u8 x s8 sums, times the scales, plus the bias, in one kernel; strides as a slice)."""
    p, (_, *spatial, cin) = layer.params, layer.inputs[0].shape
    q, sw = _kernel(layer)
    if any(st != 1 for st in p["strides"]):
        x_uint8 = g.slice(x_uint8, [0] * len(spatial), spatial, list(range(1, len(spatial) + 1)), p["strides"])
    ins = [g.reshape(x_uint8, [-1, cin]), g.const(q.reshape(len(sw), cin).T, np.int8),
           g.scalar(_range_scale(layer.inputs[0], layer), np.float32), g.const(sw, np.float32),
           g.scalar(0, np.uint8), g.scalar(0, np.int8)]
    if "bias" in layer.weights:
        ins.append(g.const(weight(layer, "bias"), np.float32))
    return g.reshape(g.node("MatMulIntegerToFloat", ins, domain=CONTRIB), layer.outputs[0].shape)


def _quantized_residual(g: Graph, layer, ins):
    """`ins` with a residual that has a range rounded to its int8 grid (numpy_precision's contract), from its fp16
    value as the numpy backend holds it (QuantizeLinear gives -128 below -127.5 steps, where numpy clips to -127)."""
    if len(ins) < 2 or layer.inputs[1].dynamic_range is None:
        return ins
    s, zero = g.scalar(_range_scale(layer.inputs[1], layer), np.float32), g.scalar(0, np.int8)
    r = g.cast(g.cast(ins[1], "float32", "float16"), "float16", "float32")
    return [ins[0], g.node("DequantizeLinear", [g.node("QuantizeLinear", [r, s, zero]), s, zero]), *ins[2:]]


@_int8("Convolution")
def _convolution(g, layer, ins):
    ins = _quantized_residual(g, layer, ins)
    t, nsp = layer.inputs[0], layer.weights["kernel"].ndim - 2
    unsigned = nonnegative(t)
    if unsigned and _quantizes_output(layer):
        g.uint8[layer.outputs[0].name] = lambda: _qlinear(g, layer, _uint8(g, t, ins[0], layer))
    if unsigned and _pointwise(layer):
        return [nn.residual_activation(g, layer, _matmul_to_float(g, layer, _uint8(g, t, ins[0], layer)), ins)]
    sx = g.scalar(_range_scale(t, layer), np.float32)
    if unsigned:
        x = g.node("DequantizeLinear", [_uint8(g, t, ins[0], layer), sx, g.scalar(0, np.uint8)])
    else:
        zero = g.scalar(0, np.int8)
        x = g.node("DequantizeLinear", [g.node("QuantizeLinear", [ins[0], sx, zero]), sx, zero])
    q, sw = _kernel(layer)
    kernel = g.const(q * sw.reshape(-1, *[1] * (q.ndim - 1)), np.float32)
    bias = g.const(weight(layer, "bias"), np.float32) if "bias" in layer.weights else None
    y = nn.conv(g, layer, nn.to_channels_first(g, x, nsp), kernel, bias)
    return [nn.conv_epilogue(g, layer, y, ins)]


def _quantized(g: Graph, layer, i: int, x: str, signed: bool = False):
    """(activation `x` of input `i` as uint8 around 128, or as int8 where `signed`, its scale): the same values."""
    scale = _range_scale(layer.inputs[i], layer)
    zero = g.scalar(0, np.int8) if signed else g.scalar(ZERO, np.uint8)
    return g.node("QuantizeLinear", [x, g.scalar(scale, np.float32), zero]), scale


@functools.lru_cache(maxsize=None)
def signed_sums_exact() -> bool:
    """Whether this CPU's ONNX Runtime sums uint8 x int8 products exactly: its VNNI and AMX kernels do (about 10x
    its uint8 x uint8 ones here: BERT's FFN expansion at 1,024 rows 12.4 -> 1.2 ms), its AVX2 ones add product
    pairs in int16 with saturation. Asked of the kernel itself, with operands that saturate such pairs, on one row
    and on many (ONNX Runtime may take another kernel for a single row)."""
    import onnxruntime as ort
    from onnx import helper

    k, n = 64, 16
    b = np.tile(np.array([127, -127], np.int8), k * n // 2).reshape(k, n)
    want = (255 - ZERO) * b.astype(np.int64).sum(axis=0)
    g = Graph()
    out = g.node("MatMulIntegerToFloat", ["a", g.const(b), g.scalar(1, np.float32), g.scalar(1, np.float32),
                                          g.scalar(ZERO, np.uint8), g.scalar(0, np.int8)], domain=CONTRIB)
    model = g.model("probe", [helper.make_tensor_value_info("a", onnx_dtype("uint8"), [None, k])],
                    [helper.make_tensor_value_info(out, onnx_dtype("float32"), [None, n])])
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return all(np.array_equal(session.run(None, {"a": np.full((rows, k), 255, np.uint8)})[0], np.tile(want, (rows, 1)))
               for rows in (1, 64))


@_int8("MatrixMultiply")
def _matmul(g, layer, ins):
    """Constant operands int8 per output channel (rows of A, columns of B), the others per tensor. A is uint8
    around 128; B is int8 where the CPU sums u8 x s8 exactly (signed_sums_exact), else uint8 around 128 too (u8 x
    u8 sums are exact on every x86 CPU). The scales go into ONNX Runtime's MatMulIntegerToFloat where they are per
    column (or per tensor): its products are float(sums) x scale, as a Cast and a Mul would make them; so does the
    bias, unless a fused bias-activation (FastGelu, BiasGelu) takes it."""
    signed = signed_sums_exact()
    operands, scale = [], np.float64(1)
    for i, (x, flag, axis) in enumerate(zip(ins, ("transpose_a", "transpose_b"), (-2, -1))):
        t, signed_operand = layer.inputs[i], signed and i == 1
        if t.producer is not None and t.producer.kind == "Constant":
            w = weight(t.producer, "value")
            q, s = quantize_per_channel(np.swapaxes(w, -1, -2) if layer.params.get(flag) else w, axis=axis)
            operands.append(g.const(q, np.int8) if signed_operand else g.const(q + ZERO, np.uint8))
        else:
            x, s = _quantized(g, layer, i, nn.swap_last(g, x, t.rank) if layer.params.get(flag) else x, signed_operand)
            operands.append(x)
        scale = scale * s
    zeros = [g.scalar(ZERO, np.uint8), g.scalar(0, np.int8) if signed else g.scalar(ZERO, np.uint8)]
    scale = np.asarray(scale, np.float32)
    if scale.ndim >= 2 and scale.shape[-2] > 1:  # a constant A: a scale per row
        out = g.node("Mul", [g.cast(g.node("MatMulInteger", operands + zeros), "int32", "float32"), g.const(scale)])
        return [nn.matmul_epilogue(g, layer, out)]
    column = g.scalar(scale.item(), np.float32) if scale.size == 1 else g.const(scale.reshape(-1))
    bias, act = (weight(layer, "bias") if "bias" in layer.weights else None), layer.params.get("activation")
    own_bias = (bias is not None and bias.shape == (layer.outputs[0].shape[-1],)
                and not (act and act["type"] in BIASED))  # else the fused bias-activation (or an Add) adds it
    ins = operands + [g.scalar(1, np.float32), column] + zeros + ([g.const(bias, np.float32)] if own_bias else [])
    out = g.node("MatMulIntegerToFloat", ins, domain=CONTRIB)
    return [biased_activation(g, out, layer.outputs[0].shape[-1], None if own_bias else bias, act, np.float32)]


def _fake_quantized(g: Graph, t: Tensor, x: str, layer: Layer) -> str:
    """Float32 `x` (of tensor `t`) at its int8 values times its scale, as numpy_precision computes them: clipped to
    +-127 steps first (QuantizeLinear would give -128 where numpy clips to -127), QuantizeLinear (fp32 division:
    a value within fp32 rounding of a half step, about 2 in a million, may round to the other side), then q x s in
    fp32 by Cast and Mul (no DequantizeLinear, which ONNX Runtime copies for each reader of the fused QKV tensor)."""
    scale = _range_scale(t, layer)
    bound = np.float32(QMAX * scale)
    x = g.node("Clip", [x, g.scalar(-bound, np.float32), g.scalar(bound, np.float32)])
    s = g.scalar(scale, np.float32)
    return g.node("Mul", [g.cast(g.node("QuantizeLinear", [x, s, g.scalar(0, np.int8)]), "int8", "float32"), s])


@_int8("Attention")
def _attention(g, layer, ins):
    """q, k and v fake-quantized (a tensor read as several of them once), then the float Attention lowering."""
    values: Dict[int, str] = {}
    for t, x in zip(layer.inputs[:3], ins):
        if id(t) not in values:
            values[id(t)] = _fake_quantized(g, t, x, layer)
    return LOWERINGS["Attention"](g, layer, [values[id(t)] for t in layer.inputs[:3]] + ins[3:])
