"""Reference kernels of convolution, matrix multiply, pooling, attention and normalization kinds."""
from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from tftrt_py.engine.layer_geometry import attention_columns, causal_keep
from tftrt_py.engine.reference.pointwise import apply_activation, stable_softmax
from tftrt_py.engine.reference.registry import kernel

__all__ = ["conv_sums"]


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
    out = stable_softmax(scores, -1) @ v
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
