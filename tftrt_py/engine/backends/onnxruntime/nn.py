"""Lowerings of the kinds with weights or windows (Convolution, Deconvolution, MatrixMultiply, MLP, Pooling,
Softmax, Attention, Normalization). Engines are channels-last; ONNX convolutions and pools are channels-first,
so those are wrapped in transposes (ONNX Runtime's layout passes cancel the pairs between them)."""
from __future__ import annotations

from typing import List, Optional

import numpy as np

from tftrt_py.engine.backends.onnxruntime.graph import CONTRIB, Graph, compute_dtype
from tftrt_py.engine.backends.onnxruntime.pointwise import activation, biased_activation
from tftrt_py.engine.backends.onnxruntime.registry import lowers, weight
from tftrt_py.engine.layer_geometry import attention_columns, attention_scores_shape, causal_keep

__all__ = ["to_channels_first", "to_channels_last", "onnx_kernel", "conv", "conv_epilogue", "residual_activation",
           "swap_last", "matmul_epilogue"]


def to_channels_first(g: Graph, x: str, nsp: int) -> str:
    return g.transpose(x, [0, nsp + 1, *range(1, nsp + 1)])


def to_channels_last(g: Graph, x: str, nsp: int) -> str:
    return g.transpose(x, [0, *range(2, nsp + 2), 1])


def onnx_kernel(layer) -> np.ndarray:
    """The layer's kernel [*K, a, b] in ONNX's layout [b, a, *K], float32 (Conv: a = C/groups, b = Cout;
    ConvTranspose: a = Cout, b = Cin)."""
    k = weight(layer, "kernel")
    nsp = k.ndim - 2
    return np.transpose(k, [nsp + 1, nsp, *range(nsp)]).astype(np.float32)


def conv(g: Graph, layer, x: str, kernel: str, bias: Optional[str]) -> str:
    """The Conv node of `layer` on channels-first `x`."""
    p = layer.params
    nsp = layer.weights["kernel"].ndim - 2
    return g.node("Conv", [x, kernel] + ([bias] if bias else []),
                  kernel_shape=list(layer.weights["kernel"].shape[:nsp]), strides=p["strides"],
                  dilations=p["dilations"], pads=p["pre_padding"] + p["post_padding"], group=p.get("groups", 1))


def residual_activation(g: Graph, layer, out: str, ins) -> str:
    """A convolution's channels-last sums `out` plus the residual (its second input), through its activation."""
    if len(ins) > 1:
        out = g.node("Add", [out, ins[1]])
    return activation(g, out, layer.params.get("activation"), np.float32)


def conv_epilogue(g: Graph, layer, y: str, ins) -> str:
    """Channels-first convolution sums `y` back to channels-last, plus the residual, through the activation."""
    return residual_activation(g, layer, to_channels_last(g, y, layer.weights["kernel"].ndim - 2), ins)


@lowers("Convolution")
def _convolution(g, layer, ins):
    nsp = layer.weights["kernel"].ndim - 2
    bias = g.const(weight(layer, "bias"), np.float32) if "bias" in layer.weights else None
    y = conv(g, layer, to_channels_first(g, ins[0], nsp), g.const(onnx_kernel(layer)), bias)
    return [conv_epilogue(g, layer, y, ins)]


@lowers("Deconvolution")
def _deconvolution(g, layer, ins):
    """ConvTranspose without padding (the full output), zero-extended where the requested window passes its
    end, then cropped to [pre, pre + output) as the numpy kernel does."""
    p = layer.params
    k = layer.weights["kernel"]
    nsp = k.ndim - 2
    out = g.node("ConvTranspose", [to_channels_first(g, ins[0], nsp), g.const(onnx_kernel(layer))],
                 kernel_shape=list(k.shape[:nsp]), strides=p["strides"])
    spatial = layer.inputs[0].shape[1:-1]
    full = [(s - 1) * st + kk for s, st, kk in zip(spatial, p["strides"], k.shape[:nsp])]
    ends = [b + o for b, o in zip(p["pre_padding"], p["output_spatial"])]
    extra = [max(e - f, 0) for e, f in zip(ends, full)]
    if any(extra):
        out = g.node("Pad", [out, g.ints([0] * (nsp + 2) + [0, 0] + extra)])
    out = g.slice(out, p["pre_padding"], ends, list(range(2, nsp + 2)))
    return [to_channels_last(g, out, nsp)]


def swap_last(g: Graph, x: str, rank: int) -> str:
    return g.transpose(x, [*range(rank - 2), rank - 1, rank - 2])


def matmul_operands(g: Graph, layer, ins) -> List[str]:
    """A and B of `layer`, transposed as its params say."""
    flags = ("transpose_a", "transpose_b")
    return [swap_last(g, x, t.rank) if layer.params.get(f) else x for x, t, f in zip(ins, layer.inputs, flags)]


def matmul_epilogue(g: Graph, layer, out: str) -> str:
    bias = weight(layer, "bias") if "bias" in layer.weights else None
    width = layer.outputs[0].shape[-1]
    return biased_activation(g, out, width, bias, layer.params.get("activation"), np.float32)


def _with_residual(g: Graph, x: str, residual: List[str]) -> str:
    """A GEMM's product plus its residual input, if it has one (before its bias and activation: they commute)."""
    return g.node("Add", [x, residual[0]]) if residual else x


@lowers("MatrixMultiply")
def _matmul(g, layer, ins):
    product = g.node("MatMul", matmul_operands(g, layer, ins[:2]))
    return [matmul_epilogue(g, layer, _with_residual(g, product, ins[2:]))]


@lowers("MLP")
def _mlp(g, layer, ins):
    x, last = ins[0], len(layer.params["activations"]) - 1
    for i, act in enumerate(layer.params["activations"]):
        x = g.node("MatMul", [x, g.const(weight(layer, f"w{i}"), np.float32)])
        if i == last:
            x = _with_residual(g, x, ins[1:])
        b = weight(layer, f"b{i}")
        x = biased_activation(g, x, b.shape[0], b, act, np.float32)
    return [x]


def _padded_windows(layer) -> np.ndarray:
    """Per output position of `layer` (a Pooling), whether its window reaches into the padding: [*out spatial]."""
    p = layer.params
    touches = None
    for d, (n, k, s, lo) in enumerate(zip(layer.inputs[0].shape[1:-1], p["window"], p["strides"],
                                         p["pre_padding"])):
        first = np.arange(layer.outputs[0].shape[1 + d]) * s - lo
        axis = (first < 0) | (first + k > n)
        axis = axis.reshape([-1 if i == d else 1 for i in range(len(p["window"]))])
        touches = axis if touches is None else touches | axis
    return touches


@lowers("Pooling")
def _pooling(g, layer, ins):
    """Max pooling as TF's: NaN skipped (read as -Inf; ONNX Runtime's MaxPool would propagate it) and never
    below the dtype's lowest (what windows of -Inf or NaN give), its padding ignored or, with
    count_include_pad (a zero Padding folded in), zeros: windows reaching into the padding are then never below
    0 (ONNX Runtime's padding, ignored, keeps the padded tensor from being made). Inputs of finite values only
    (checked as the sum of x * 0 being a number) skip the NaN handling. Average pooling divides by the window or
    by its elements inside the input (count_include_pad)."""
    p = layer.params
    nsp = len(p["window"])
    x = to_channels_first(g, ins[0], nsp)
    attrs = dict(kernel_shape=p["window"], strides=p["strides"], pads=p["pre_padding"] + p["post_padding"])
    if p["type"] == "max":
        dtype = compute_dtype(layer.inputs[0].dtype)
        floor = g.scalar(np.finfo(dtype).min, dtype)
        if p.get("count_include_pad", False):  # the zeros padded in count: 0 where a window reaches them
            floor = g.const(np.where(_padded_windows(layer), 0, np.finfo(dtype).min)[None, None].astype(dtype))

        def skipping_nan(b: Graph) -> str:
            y = b.node("Where", [b.node("IsNaN", [x]), b.scalar(-np.inf, dtype), x])
            return b.node("Max", [b.node("MaxPool", [y], **attrs), floor])

        def finite(b: Graph) -> str:  # windows of finite values: never below the lowest
            pooled = b.node("MaxPool", [x], **attrs)
            return b.node("Max", [pooled, floor]) if p.get("count_include_pad", False) else pooled

        nonfinite = g.node("IsNaN", [g.node("ReduceSum", [g.node("Mul", [x, g.scalar(0.0, dtype)])], keepdims=0)])
        out = g.when(nonfinite, skipping_nan, finite, dtype)
    else:
        out = g.node("AveragePool", [x], count_include_pad=int(bool(p.get("count_include_pad", False))), **attrs)
    return [to_channels_last(g, out, nsp)]


@lowers("Softmax")
def _softmax(g, layer, ins):
    return [g.node("Softmax", ins, axis=layer.params["axis"])]


def _heads(g: Graph, x: str, shape, heads: int) -> str:
    """Packed [B, S, H*D] -> [B, H, S, D]."""
    return g.transpose(g.reshape(x, [shape[0], shape[1], heads, shape[2] // heads]), [0, 2, 1, 3])


#: The mask values low enough for ONNX Runtime's MultiHeadAttention, which adds the mask value to masked scores
#: where the Attention replaces them: a masked score's softmax weight is then 0 either way, and a fully masked row
#: stays uniform while its scaled scores lie within half an ulp of the mask value (+-32 at Keras's -1e9).
MHA_MASK_VALUE = -1e9


def _key_mask(g: Graph, layer, mask: str) -> Optional[str]:
    """The Attention's bool mask as MultiHeadAttention's int32 key_padding_mask: [B, Sk] when it masks keys
    only, [B, Sq, Sk] when it masks per query; None when it differs per head."""
    b, _, sq, sk = attention_scores_shape(layer)
    mb, mh, mq, mk = layer.inputs[3].shape
    if mh != 1:
        return None
    have, want = ([mb, mk], [b, sk]) if mq == 1 else ([mb, mq, mk], [b, sq, sk])
    x = g.reshape(g.cast(mask, "bool", "int32"), have)
    return x if have == want else g.node("Expand", [x, g.ints(want)])


def _multihead(g: Graph, layer, ins) -> Optional[str]:
    """A packed Attention as ONNX Runtime's fused MultiHeadAttention (com.microsoft: per batch and head, q k^T
    scaled, plus the mask, softmax, times v; heads written in place: a BERT-base layer's attention at batch 8 took
    4.9 ms instead of 6.6 on a 2-CPU AVX2 host), or None where that kernel would compute something else (causal,
    a mask per head, a mask value above MHA_MASK_VALUE, scale 0: its default)."""
    p = layer.params
    masked = len(ins) > 3
    if p.get("causal") or not p["scale"] or (masked and not p["mask_value"] <= MHA_MASK_VALUE):
        return None
    key_mask = _key_mask(g, layer, ins[3]) if masked else ""
    if key_mask is None:
        return None
    qkv = []
    for x, t, (c, w) in zip(ins[:3], layer.inputs, attention_columns(layer)):
        x = g.cast(x, compute_dtype(t.dtype), "float32")
        qkv.append(g.slice(x, [c], [c + w], [2]) if w != t.shape[-1] else x)
    return g.node("MultiHeadAttention", qkv + ["", key_mask], domain=CONTRIB, num_heads=p["heads"],
                  scale=float(p["scale"]), mask_filter_value=float(p["mask_value"]) if masked else None)


@lowers("Attention")
def _attention(g, layer, ins):
    heads = layer.params.get("heads")
    fused = heads and _multihead(g, layer, ins)
    if fused:
        return [g.cast(fused, "float32", compute_dtype(layer.outputs[0].dtype))]
    q, k, v = [], [], []
    for x, t, (c, w), out in zip(ins[:3], layer.inputs, attention_columns(layer), (q, k, v)):
        x = g.cast(x, compute_dtype(t.dtype), "float32")
        if w != t.shape[-1]:
            x = g.slice(x, [c], [c + w], [t.rank - 1])
        out.append(_heads(g, x, (*t.shape[:-1], w), heads) if heads else x)
    (q,), (k,), (v,) = q, k, v
    rank = 4 if heads else layer.inputs[0].rank
    scores = g.node("Mul", [g.node("MatMul", [q, swap_last(g, k, rank)]),
                            g.scalar(layer.params["scale"], np.float32)])
    tril = layer.params.get("causal") and g.const(causal_keep(*attention_scores_shape(layer)[-2:]))
    mask = ins[3] if len(ins) > 3 else None
    keep = g.node("And", [mask, tril]) if mask and tril else mask or tril
    if keep:
        scores = g.node("Where", [keep, scores, g.scalar(layer.params["mask_value"], np.float32)])
    out = g.node("MatMul", [g.node("Softmax", [scores], axis=-1), v])
    if heads:
        out = g.reshape(g.transpose(out, [0, 2, 1, 3]), layer.outputs[0].shape)
    return [g.cast(out, "float32", compute_dtype(layer.outputs[0].dtype))]


@lowers("Normalization")
def _normalization(g, layer, ins):
    """TF's layer normalization in float32, step by step: the mean, the mean of squared differences, times
    1/sqrt(var + epsilon), scale and bias. ONNX Runtime's fused LayerNormalization sums in double: where TF's
    float32 sums overflow (a row of 3e38 gives NaN, a row whose squares overflow gives the bias) it answered
    finite values (0.14 -> 0.34 ms a [8, 128, 768] tensor on a 2-CPU AVX-512 host)."""
    s = ins[0] if len(ins) == 1 else g.node("Add", ins)
    axes = g.ints([-1])
    d = g.node("Sub", [s, g.node("ReduceMean", [s, axes], keepdims=1)])
    var = g.node("ReduceMean", [g.node("Mul", [d, d]), axes], keepdims=1)
    eps = g.scalar(layer.params["epsilon"], np.float32)
    rstd = g.node("Reciprocal", [g.node("Sqrt", [g.node("Add", [var, eps])])])
    y = g.node("Mul", [g.node("Mul", [d, rstd]), g.const(weight(layer, "scale"), np.float32)])
    return [g.node("Add", [y, g.const(weight(layer, "bias"), np.float32)])]
