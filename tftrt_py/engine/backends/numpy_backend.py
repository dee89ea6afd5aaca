"""The reference backend: every layer kind in numpy, on the CPU.

One short function per layer kind, registered in ``KERNELS``. Each takes the layer and
its input arrays and returns the output arrays. Accumulation is in float32 (float64 for
the few ops numpy would otherwise lose accuracy on), results cast to the layer's dtype. Layers the
builder set to FP16, INT8 or FP8 run through :mod:`numpy_precision`, which computes them as the GPU does.
"""
from __future__ import annotations

from typing import Callable, Dict, List

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from tftrt_py.engine.errors import BackendError
from tftrt_py.engine.layers import attention_columns, causal_keep

__all__ = ["NumpyBackend", "KERNELS", "conv_sums", "apply_activation"]

KERNELS: Dict[str, Callable] = {}


def kernel(kind: str):
    def wrap(fn):
        KERNELS[kind] = fn
        return fn

    return wrap


def _erf(x):
    """erf by Abramowitz & Stegun 7.1.26 in float64 (absolute error below 1.5e-7)."""
    z = np.abs(x.astype(np.float64))
    t = 1.0 / (1.0 + 0.3275911 * z)
    poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))))
    return (np.sign(x) * (1.0 - poly * np.exp(-z * z))).astype(x.dtype)


def _erfc(x):
    """erfc by the Chebyshev fit of Numerical Recipes' erfcc in float64 (relative error below 1.2e-7,
    so the tail keeps float32 accuracy where 1 - erf(x) would not)."""
    z = np.abs(x.astype(np.float64))
    t = 1.0 / (1.0 + 0.5 * z)
    coeffs = (-1.26551223, 1.00002368, 0.37409196, 0.09678418, -0.18628806, 0.27886807, -1.13520398,
              1.48851587, -0.82215223, 0.17087277)
    poly = np.zeros_like(t)
    for c in reversed(coeffs[1:]):
        poly = t * (c + poly)
    tail = t * np.exp(-z * z + coeffs[0] + poly)
    return np.where(x >= 0, tail, 2.0 - tail).astype(x.dtype)


def _gelu_erf(x):
    return 0.5 * x * (1.0 + _erf(x / np.sqrt(2.0).astype(x.dtype)))


def _gelu_tanh(x):
    c = np.asarray(np.sqrt(2.0 / np.pi), x.dtype)
    return 0.5 * x * (1.0 + np.tanh(c * (x + np.asarray(0.044715, x.dtype) * x ** 3)))


def _hard_sigmoid(x, alpha):
    """relu6(x + 3) / 6, or * alpha: the steps and their order are TF's, so float32 results are TF's bits."""
    r = np.minimum(np.maximum(x + np.asarray(3, x.dtype), np.asarray(0, x.dtype)), np.asarray(6, x.dtype))
    return r / np.asarray(6, x.dtype) if alpha is None else r * np.asarray(alpha, x.dtype)


def _sigmoid(x):
    return (1.0 / (1.0 + np.exp(-x))).astype(x.dtype)  # exp overflows to inf for very negative x: sigmoid is 0


_SELU_ALPHA, _SELU_SCALE = 1.6732632423543772, 1.0507009873554805

ACTIVATION_FNS = {
    "relu": lambda x, a, b: np.maximum(x, 0),
    "relu6": lambda x, a, b: np.clip(x, 0, 6),
    "clip": lambda x, a, b: np.clip(x, a, b),
    "leaky_relu": lambda x, a, b: np.where(x >= 0, x, x * np.asarray(a, x.dtype)),
    "elu": lambda x, a, b: np.where(x > 0, x, np.asarray(a, x.dtype) * np.expm1(np.minimum(x, 0))),
    "selu": lambda x, a, b: np.asarray(_SELU_SCALE, x.dtype) * np.where(
        x > 0, x, np.asarray(_SELU_ALPHA, x.dtype) * np.expm1(np.minimum(x, 0))),
    "sigmoid": lambda x, a, b: _sigmoid(x),
    "tanh": lambda x, a, b: np.tanh(x),
    "softplus": lambda x, a, b: np.logaddexp(x, np.zeros((), x.dtype)),
    "softsign": lambda x, a, b: x / (1 + np.abs(x)),
    "gelu_erf": lambda x, a, b: _gelu_erf(x),
    "gelu_tanh": lambda x, a, b: _gelu_tanh(x),
    "swish": lambda x, a, b: x * _sigmoid(x),
    "hard_sigmoid": lambda x, a, b: _hard_sigmoid(x, a),
    "hard_swish": lambda x, a, b: x * _hard_sigmoid(x, a),
}

UNARY_FNS = {
    "exp": np.exp, "log": np.log, "sqrt": np.sqrt, "rsqrt": lambda x: 1 / np.sqrt(x),
    "recip": lambda x: 1 / x, "abs": np.abs, "neg": np.negative, "sin": np.sin, "cos": np.cos,
    "tan": np.tan, "sinh": np.sinh, "cosh": np.cosh, "asin": np.arcsin, "acos": np.arccos,
    "atan": np.arctan, "asinh": np.arcsinh, "acosh": np.arccosh, "atanh": np.arctanh,
    "ceil": np.ceil, "floor": np.floor, "round": np.round, "sign": np.sign, "erf": _erf,
    "square": np.square, "not": np.logical_not, "erfc": _erfc,
}


def _floor_div(a, b):
    if np.issubdtype(a.dtype, np.integer):
        return np.floor_divide(a, b)
    return np.floor(a / b)


def _power(a, b):
    """np.power, but a float32 tensor cubed by multiplying: numpy's float32 pow runs ~50x slower than a * a * a,
    within an ulp of it (GELU's tanh form cubes BERT's FFN tensor: 12.6M values at batch 32, 558 vs 11 ms)."""
    cube = np.ndim(b) <= np.ndim(a) and np.size(b) == 1 and np.asarray(b).item() == 3
    if cube and a.dtype == np.float32:
        return a * a * a
    return np.power(a, b)


ELEMENTWISE_FNS = {
    "sum": np.add, "sub": np.subtract, "prod": np.multiply, "div": np.divide, "max": np.maximum,
    "min": np.minimum, "pow": _power, "floor_div": _floor_div, "floor_mod": np.mod,
    "squared_difference": lambda a, b: np.square(a - b), "equal": np.equal, "greater": np.greater,
    "greater_equal": np.greater_equal, "less": np.less, "less_equal": np.less_equal,
    "not_equal": np.not_equal, "and": np.logical_and, "or": np.logical_or,
    "bitwise_and": np.bitwise_and,
}

def _sum_squares(x, axis, keepdims):
    return np.sum(np.square(x), axis=axis, keepdims=keepdims)


REDUCE_FNS = {"sum": np.sum, "mean": np.mean, "max": np.max, "min": np.min, "prod": np.prod,
              "l1": lambda x, axis, keepdims: np.sum(np.abs(x), axis=axis, keepdims=keepdims),
              "sum_squares": _sum_squares,
              "l2": lambda x, axis, keepdims: np.sqrt(_sum_squares(x, axis, keepdims)),
              "log_sum": lambda x, axis, keepdims: np.log(np.sum(x, axis=axis, keepdims=keepdims)),
              "log_sum_exp": lambda x, axis, keepdims: np.log(np.sum(np.exp(x), axis=axis, keepdims=keepdims))}


def apply_activation(x, activation):
    if not activation:
        return x
    return ACTIVATION_FNS[activation["type"]](x, activation.get("alpha"), activation.get("beta"))


@kernel("Constant")
def _constant(layer, inputs):
    return [layer.weights["value"]]


@kernel("Identity")
def _identity(layer, inputs):
    return [inputs[0].astype(layer.outputs[0].dtype, copy=False)]


@kernel("Bitcast")
def _bitcast(layer, inputs):
    return [np.ascontiguousarray(inputs[0]).view(layer.outputs[0].dtype)]


def _windows(x, window, strides, dilations, pre, post, pad_value=0.0):
    """Sliding windows of a channels-last tensor: [N, *O, C, *K]."""
    nsp = len(window)
    pad = [(0, 0)] + [(a, b) for a, b in zip(pre, post)] + [(0, 0)]
    if any(pre) or any(post):
        x = np.pad(x, pad, constant_values=pad_value)
    span = [d * (k - 1) + 1 for k, d in zip(window, dilations)]
    win = sliding_window_view(x, span, axis=tuple(range(1, nsp + 1)))
    index = (slice(None),) + tuple(slice(None, None, s) for s in strides) + (slice(None),)
    index += tuple(slice(None, None, d) for d in dilations)
    return win[index]


@kernel("Convolution")
def _convolution(layer, inputs):
    p, w = layer.params, layer.weights
    out = conv_sums(inputs[0], w["kernel"], p)  # a fresh array: the epilogue works in place
    if "bias" in w:
        out += w["bias"]
    if len(inputs) > 1:
        out += inputs[1]
    return [apply_activation(out, p.get("activation")).astype(layer.outputs[0].dtype, copy=False)]


def conv_sums(x, k, p):
    """The sums of a Convolution (no bias, residual or activation) of x [N, *S, C] with kernel k, computed in
    the operands' dtype (the INT8 kernels pass integers held exactly in float64)."""
    nsp = k.ndim - 2
    groups = p.get("groups", 1)
    pointwise = all(d == 1 for d in k.shape[:nsp]) and not any(p["pre_padding"]) and not any(p["post_padding"])
    if pointwise and groups == 1:  # a 1x1 convolution is one matrix product over the strided pixels
        x = x[(slice(None),) + tuple(slice(None, None, s) for s in p["strides"])]
        return (x.reshape(-1, x.shape[-1]) @ k.reshape(k.shape[-2], k.shape[-1])).reshape(*x.shape[:-1], -1)
    win = _windows(x, k.shape[:nsp], p["strides"], p["dilations"], p["pre_padding"], p["post_padding"])
    sp = "abcd"[:nsp]
    if groups == 1:
        wk = np.moveaxis(k, nsp, 0)  # [C, *K, Cout]
        out = np.tensordot(win, wk, axes=(list(range(nsp + 1, 2 * nsp + 2)), list(range(nsp + 1))))
    else:
        n, *o, c = win.shape[:nsp + 2]
        cg = c // groups
        win = win.reshape(n, *o, groups, cg, *k.shape[:nsp])
        wk = k.reshape(*k.shape[:nsp], cg, groups, k.shape[-1] // groups)
        osub = "hwz"[:nsp]
        out = np.einsum(f"n{osub}gc{sp},{sp}cgm->n{osub}gm", win, wk, optimize=True)
        out = out.reshape(n, *o, k.shape[-1])
    return out


@kernel("Deconvolution")
def _deconvolution(layer, inputs):
    """Transposed convolution as scatter-add of per-pixel kernel products, then crop."""
    x = inputs[0]
    p = layer.params
    k = layer.weights["kernel"]  # [*K, Cout, Cin]
    nsp = k.ndim - 2
    strides, out_sp = p["strides"], p["output_spatial"]
    prod = np.tensordot(x, k, axes=([x.ndim - 1], [k.ndim - 1]))  # [N, *S, *K, Cout]
    full = [max((s - 1) * st + kk, b + o)  # rows no window reaches stay zero
            for s, st, kk, b, o in zip(x.shape[1:-1], strides, k.shape[:nsp], p["pre_padding"], out_sp)]
    acc = np.zeros((x.shape[0], *full, k.shape[-2]), dtype=np.float32)
    for kidx in np.ndindex(*k.shape[:nsp]):
        sl = (slice(None),) + tuple(slice(i, i + (s - 1) * st + 1, st)
                                    for i, s, st in zip(kidx, x.shape[1:-1], strides))
        acc[sl] += prod[(slice(None),) * (nsp + 1) + kidx]
    crop = (slice(None),) + tuple(slice(b, b + o) for b, o in zip(p["pre_padding"], out_sp))
    return [acc[crop].astype(layer.outputs[0].dtype)]


@kernel("MatrixMultiply")
def _matmul(layer, inputs):
    a, b = inputs[:2]
    p = layer.params
    if p.get("transpose_a"):
        a = np.swapaxes(a, -1, -2)
    if p.get("transpose_b"):
        b = np.swapaxes(b, -1, -2)
    out = np.matmul(a, b)
    if "bias" in layer.weights:
        out = out + layer.weights["bias"]
    if len(inputs) > 2:
        out = out + inputs[2]
    return [apply_activation(out, p.get("activation")).astype(layer.outputs[0].dtype, copy=False)]


@kernel("MLP")
def _mlp(layer, inputs):
    x, last = inputs[0], len(layer.params["activations"]) - 1
    for i, activation in enumerate(layer.params["activations"]):
        x = x @ layer.weights[f"w{i}"] + layer.weights[f"b{i}"]
        if i == last and len(inputs) > 1:
            x = x + inputs[1]
        x = apply_activation(x, activation)
    return [x.astype(layer.outputs[0].dtype, copy=False)]


@kernel("ElementWise")
def _elementwise(layer, inputs):
    a, b = inputs
    return [np.asarray(ELEMENTWISE_FNS[layer.params["op"]](a, b)).astype(layer.outputs[0].dtype, copy=False)]


@kernel("Select")
def _select(layer, inputs):
    return [np.where(*inputs).astype(layer.outputs[0].dtype, copy=False)]


@kernel("Unary")
def _unary(layer, inputs):
    out = UNARY_FNS[layer.params["op"]](inputs[0])
    return [np.asarray(out).astype(layer.outputs[0].dtype, copy=False)]


@kernel("Activation")
def _activation(layer, inputs):
    out = apply_activation(inputs[0], layer.params)
    return [np.asarray(out).astype(layer.outputs[0].dtype, copy=False)]


@kernel("Scale")
def _scale(layer, inputs):
    x = inputs[0]
    axis = layer.params.get("channel_axis", -1) % x.ndim
    shape = [1] * x.ndim
    shape[axis] = -1

    def w(key):
        v = layer.weights.get(key)
        return None if v is None else v.reshape(shape if v.size > 1 else [])

    out = x
    scale, shift, power = w("scale"), w("shift"), w("power")
    if scale is not None:
        out = out * scale
    if shift is not None:
        out = out + shift
    if power is not None:
        out = out ** power
    out = apply_activation(out, layer.params.get("activation"))
    return [np.asarray(out).astype(layer.outputs[0].dtype, copy=False)]


@kernel("Pooling")
def _pooling(layer, inputs):
    x = inputs[0]
    p = layer.params
    nsp = len(p["window"])
    ones = [1] * nsp
    axes = tuple(range(-nsp, 0))
    if p["type"] == "max":  # TF's MaxPool: NaN skipped, nothing below the dtype's lowest (all-NaN windows give it);
        # padding is ignored, or zeros with count_include_pad (a zero Padding folded in)
        pad_value = 0.0 if p.get("count_include_pad", False) else -np.inf
        win = _windows(x, p["window"], p["strides"], ones, p["pre_padding"], p["post_padding"], pad_value)
        out = np.fmax.reduce(win, axis=axes, initial=np.finfo(x.dtype).min)
    else:
        win = _windows(x, p["window"], p["strides"], ones, p["pre_padding"], p["post_padding"])
        out = win.sum(axis=axes, dtype=np.float32)
        if p.get("count_include_pad", False):
            out = out / float(np.prod(p["window"]))
        else:
            mask = np.ones((1, *x.shape[1:-1], 1), np.float32)
            counts = _windows(mask, p["window"], p["strides"], ones, p["pre_padding"], p["post_padding"])
            out = out / counts.sum(axis=axes)
    return [out.astype(layer.outputs[0].dtype, copy=False)]


@kernel("Reduce")
def _reduce(layer, inputs):
    x = inputs[0]
    if layer.params.get("first_perm") is not None:
        x = np.transpose(x, layer.params["first_perm"])
    axes = tuple(a % x.ndim for a in layer.params["axes"])
    out = REDUCE_FNS[layer.params["op"]](x, axis=axes, keepdims=bool(layer.params.get("keep_dims")))
    return [np.asarray(out).astype(layer.outputs[0].dtype, copy=False)]


@kernel("ArgReduce")
def _argreduce(layer, inputs):
    """TF's ArgMax/ArgMin: the first index of the extreme among values beyond the dtype's lowest (highest), NaN
    skipped; 0 where there is none (a row of NaN or -Inf)."""
    x, axis = inputs[0], layer.params["axis"]
    if layer.params["op"] == "min":
        x = np.negative(x) if x.dtype.kind == "f" else ~x  # ~x reverses integer order without overflow
    if x.dtype.kind != "f":
        return [np.argmax(x, axis=axis).astype(np.int32)]
    beyond = x > np.finfo(x.dtype).min
    found = np.argmax(np.where(beyond, x, -np.inf), axis=axis)
    return [np.where(beyond.any(axis=axis), found, 0).astype(np.int32)]


@kernel("Shuffle")
def _shuffle(layer, inputs):
    x = inputs[0]
    p = layer.params
    if p.get("first_perm") is not None:
        x = np.transpose(x, p["first_perm"])
    if p.get("reshape") is not None:
        x = x.reshape(layer.outputs[0].shape if p.get("second_perm") is None else p["reshape"])
    if p.get("second_perm") is not None:
        x = np.transpose(x, p["second_perm"])
    return [np.asarray(x, order="C")]


@kernel("Padding")
def _padding(layer, inputs):
    p = layer.params
    pads = list(zip(p["pre"], p["post"]))
    mode = p.get("mode", "constant")
    if mode == "constant":
        return [np.pad(inputs[0], pads, constant_values=p.get("value", 0))]
    return [np.pad(inputs[0], pads, mode=mode)]


@kernel("Concatenation")
def _concat(layer, inputs):
    return [np.concatenate(inputs, axis=layer.params["axis"])]


@kernel("Slice")
def _slice(layer, inputs):
    p = layer.params
    index = tuple(slice(s, _slice_stop(s, n, st), st) for s, n, st in zip(p["start"], p["size"], p["stride"]))
    return [np.asarray(inputs[0][index], order="C")]


def _slice_stop(start, size, stride):
    """The exclusive stop of `size` elements from `start` by `stride` (None: past index 0 going down)."""
    if not size:
        return start
    stop = start + (size - 1) * stride + (1 if stride > 0 else -1)
    return None if stop < 0 else stop


def _stable_softmax(x, axis):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


@kernel("Softmax")
def _softmax(layer, inputs):
    return [_stable_softmax(inputs[0], layer.params["axis"]).astype(layer.outputs[0].dtype, copy=False)]


def _heads(a, heads):
    """Packed [B, S, H*D] -> [B, H, S, D]."""
    return a.reshape(*a.shape[:2], heads, -1).transpose(0, 2, 1, 3)


@kernel("Attention")
def _attention(layer, inputs):
    q, k, v = (a[..., c:c + w].astype(np.float32) for a, (c, w) in zip(inputs, attention_columns(layer)))
    heads = layer.params.get("heads")
    if heads:
        q, k, v = (_heads(a, heads) for a in (q, k, v))
    scores = q @ np.swapaxes(k, -1, -2) * np.float32(layer.params["scale"])
    keep = inputs[3] if len(inputs) > 3 else None
    if layer.params.get("causal"):
        keep = causal_keep(*scores.shape[-2:]) if keep is None else keep & causal_keep(*scores.shape[-2:])
    if keep is not None:
        scores = np.where(keep, scores, np.float32(layer.params["mask_value"]))
    out = _stable_softmax(scores, -1) @ v
    if heads:
        out = out.transpose(0, 2, 1, 3).reshape(layer.outputs[0].shape)
    return [out.astype(layer.outputs[0].dtype)]


@kernel("Normalization")
def _normalization(layer, inputs):
    s = sum(a.astype(np.float32) for a in inputs)
    d = s - s.mean(axis=-1, keepdims=True)
    rstd = 1 / np.sqrt(np.mean(np.square(d), axis=-1, keepdims=True) + np.float32(layer.params["epsilon"]))
    y = d * rstd * layer.weights["scale"].astype(np.float32) + layer.weights["bias"].astype(np.float32)
    return [y.astype(layer.outputs[0].dtype)]


@kernel("Gather")
def _gather(layer, inputs):
    return [np.take(inputs[0], inputs[1], axis=layer.params["axis"])]


@kernel("TopK")
def _topk(layer, inputs):
    x = inputs[0]
    axis, k = layer.params["axis"], layer.params["k"]
    order = np.argsort(-x, axis=axis, kind="stable")  # stable: ties keep the lower index first
    idx = np.take(order, np.arange(k), axis=axis)
    return [np.take_along_axis(x, idx, axis=axis), idx.astype(np.int32)]


def _iou(boxes):
    """Pairwise IoU of [M, 4] boxes in float32, corners in either order (as TF computes it)."""
    b = boxes.astype(np.float32)
    lo, hi = np.minimum(b[:, :2], b[:, 2:]), np.maximum(b[:, :2], b[:, 2:])
    area = (hi[:, 0] - lo[:, 0]) * (hi[:, 1] - lo[:, 1])
    inter = np.prod(np.maximum(np.minimum(hi[:, None], hi[None]) - np.maximum(lo[:, None], lo[None]),
                               np.float32(0)), axis=-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        iou = inter / (area[:, None] + area[None] - inter)
    return np.where((area[:, None] <= 0) | (area[None] <= 0), np.float32(0), iou)


def _nms_class(boxes, scores, limit, iou_threshold, score_threshold):
    """Greedy NMS of one class: selected box indices, best score first."""
    idx = np.flatnonzero(scores > score_threshold)
    idx = idx[np.argsort(-scores[idx], kind="stable")]
    iou = _iou(boxes[idx])
    keep = []
    for i in range(len(idx)):
        if len(keep) == limit:
            break
        if not keep or not (iou[i, keep] > iou_threshold).any():
            keep.append(i)
    return idx[keep]


@kernel("NMS")
def _nms(layer, inputs):
    """TF's CombinedNonMaxSuppression: per-class NMS, merged by score, clipped and zero-padded."""
    boxes, scores = inputs
    p = layer.params
    b, n, q, _ = boxes.shape
    out_boxes, out_scores, out_classes, valid = (np.zeros(t.shape, t.dtype) for t in layer.outputs)
    limit, d = min(p["max_output_size_per_class"], n), out_scores.shape[1]
    iou_t, score_t = np.float32(p["iou_threshold"]), np.float32(p["score_threshold"])
    for row in range(b):
        found = []  # (score, class, box index), class-major then selection order
        for c in range(scores.shape[2]):
            cls_boxes, cls_scores = boxes[row, :, c if q > 1 else 0], scores[row, :, c].astype(np.float32)
            found += [(cls_scores[i], c, i) for i in _nms_class(cls_boxes, cls_scores, limit, iou_t, score_t)]
        found.sort(key=lambda r: -r[0])
        found = found[:d]
        valid[row] = len(found)
        for j, (score, c, i) in enumerate(found):
            box = boxes[row, i, c if q > 1 else 0]
            out_boxes[row, j] = np.clip(box, 0, 1) if p.get("clip_boxes", True) else box
            out_scores[row, j], out_classes[row, j] = score, c
    return [out_boxes, out_scores, out_classes, valid]


def _resize_scale(in_size, out_size, align_corners):
    """TF's CalculateResizeScale, in float32."""
    if align_corners and out_size > 1:
        return np.float32(in_size - 1) / np.float32(out_size - 1)
    return np.float32(in_size) / np.float32(out_size)


def _nearest_index(in_size, out_size, align_corners, half_pixel):
    """Source index of each output row, as TF's ResizeNearestNeighbor computes it (float32)."""
    scale = _resize_scale(in_size, out_size, align_corners)
    pos = np.arange(out_size, dtype=np.float32)
    src = (pos + np.float32(0.5)) * scale if half_pixel else pos * scale
    src = src.astype(np.float64)  # exact; roundf rounds halves away from zero and src >= 0
    idx = np.floor(src + 0.5) if align_corners else np.floor(src)
    return np.clip(idx.astype(np.int64), 0, in_size - 1)


def _linear_weights(in_size, out_size, align_corners, half_pixel):
    """(lower, upper, lerp) per output row, as TF's ResizeBilinear computes them (float32)."""
    scale = _resize_scale(in_size, out_size, align_corners)
    pos = np.arange(out_size, dtype=np.float32)
    src = (pos + np.float32(0.5)) * scale - np.float32(0.5) if half_pixel else pos * scale
    low = np.floor(src)
    lower = np.maximum(low.astype(np.int64), 0)
    upper = np.minimum(np.ceil(src).astype(np.int64), in_size - 1)
    return lower, upper, (src - low).astype(np.float32)


@kernel("Resize")
def _resize(layer, inputs):
    x = inputs[0]
    p = layer.params
    (h, w), (oh, ow) = x.shape[1:3], p["sizes"]
    args = (p.get("align_corners", False), p.get("half_pixel_centers", False))
    if p["mode"] == "nearest":
        return [np.ascontiguousarray(x[:, _nearest_index(h, oh, *args)][:, :, _nearest_index(w, ow, *args)])]
    x = x.astype(np.float32)
    y0, y1, ylerp = _linear_weights(h, oh, *args)
    x0, x1, xlerp = _linear_weights(w, ow, *args)
    xlerp = xlerp[None, None, :, None]
    top_rows, bottom_rows = x[:, y0], x[:, y1]
    top = top_rows[:, :, x0] + (top_rows[:, :, x1] - top_rows[:, :, x0]) * xlerp
    bottom = bottom_rows[:, :, x0] + (bottom_rows[:, :, x1] - bottom_rows[:, :, x0]) * xlerp
    return [(top + (bottom - top) * ylerp[None, :, None, None]).astype(np.float32)]


class NumpyBackend:
    """Runs layers with numpy on the host, with IEEE semantics and no warnings: NaN and Inf propagate as in TF."""

    name = "numpy"

    def run_layer(self, layer, inputs: List[np.ndarray]) -> List[np.ndarray]:
        fn = KERNELS.get(layer.kind)
        if fn is None:
            raise BackendError(f"don't know how to run layer kind {layer.kind!r} on backend 'numpy'")
        with np.errstate(all="ignore"):
            if layer.precision in ("FP16", "INT8", "FP8"):  # computed as the GPU computes them
                from tftrt_py.engine.backends import numpy_precision

                return numpy_precision.run(fn, layer, inputs)
            return fn(layer, inputs)
