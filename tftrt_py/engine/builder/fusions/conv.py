"""Convolution fusions: a residual ElementWise sum, and a zero Padding in front (also of a Pooling)."""
from __future__ import annotations

import logging

from tftrt_py.engine.builder.fusions.activation import nonnegative
from tftrt_py.engine.builder.fusions.match import Fused, activation_of, apply_rules, sole_producer

__all__ = ["fuse_residual", "fuse_padding", "fuse_pooling_padding"]

logger = logging.getLogger(__name__)


def residual_sum(network, users, layer):
    """Convolution -> ElementWise sum(., r) -> y   =>   Convolution(residual r) -> y

    The sum must not broadcast the convolution's output, and r must have its shape (a batch of
    1 broadcasts). Among two fusable convolutions, the later one takes the other as residual.
    """
    if layer.params["op"] != "sum":
        return None
    out = layer.outputs[0]
    candidates = []
    for i, t in enumerate(layer.inputs):
        conv, r = sole_producer(network, users, t, ("Convolution",)), layer.inputs[1 - i]
        if (conv is not None and len(conv.inputs) == 1 and activation_of(conv) is None and t.shape == out.shape
                and r.dtype == out.dtype and r.shape in (out.shape, (1, *out.shape[1:]))):
            candidates.append((network.layers.index(conv), conv, r))
    if not candidates:
        return None
    _, conv, r = max(candidates, key=lambda c: c[0])
    return Fused("Convolution + residual sum", [conv, layer], "Convolution", [conv.inputs[0], r], conv.params,
                 conv.weights)


def _zero_padding(network, users, layer):
    """The Padding making `layer`'s input, read by `layer` only, when it pads only spatial axes, with zeros."""
    pad = sole_producer(network, users, layer.inputs[0], ("Padding",))
    if pad is None:
        return None
    p = pad.params
    if (p.get("mode", "constant") != "constant" or p.get("value", 0) != 0 or min(p["pre"] + p["post"]) < 0
            or p["pre"][0] or p["post"][0] or p["pre"][-1] or p["post"][-1]):
        return None
    return pad


def _with_padding(layer, pad, **params) -> dict:
    """`layer`'s params with `pad`'s spatial padding added to its own."""
    return dict(layer.params, pre_padding=[a + b for a, b in zip(layer.params["pre_padding"], pad.params["pre"][1:-1])],
                post_padding=[a + b for a, b in zip(layer.params["post_padding"], pad.params["post"][1:-1])], **params)


def padding_into_convolution(network, users, layer):
    """Padding(zeros, spatial axes only) -> Convolution   =>   Convolution with the padding added to its own."""
    pad = _zero_padding(network, users, layer)
    if pad is None:
        return None
    return Fused("Padding + Convolution", [pad, layer], "Convolution", [pad.inputs[0], *layer.inputs[1:]],
                 _with_padding(layer, pad), layer.weights)


def _windows_reach_input(layer, pad) -> bool:
    """True when, with `pad` folded into `layer`'s padding, every pooling window still holds an input element."""
    p, x = layer.params, pad.inputs[0]
    for i, (k, s) in enumerate(zip(p["window"], p["strides"])):
        before = p["pre_padding"][i] + pad.params["pre"][i + 1]
        last_start = (layer.outputs[0].shape[i + 1] - 1) * s
        if before >= k or last_start >= before + x.shape[i + 1]:
            return False
    return True


def padding_into_pooling(network, users, layer):
    """Padding(zeros, spatial axes only) -> Pooling   =>   Pooling with the padding added to its own.

    A pooling without padding of its own (or counting it) becomes count_include_pad: its padding then
    takes part as the Padding's zeros did (in the sum an average divides by the whole window, in a
    maximum as zeros: exact for any input, NaN included). A max pooling that ignores padding of its own
    takes the zeros only where they never win: its input is >= 0 (a relu-like activation made it) and
    every window holds an input element (an all-NaN window there gives the dtype's lowest, where the
    zeros would give 0). An average pooling not counting padding of its own cannot fold.
    """
    pad, p = _zero_padding(network, users, layer), layer.params
    if pad is None:
        return None
    if p.get("count_include_pad") or not any(p["pre_padding"] + p["post_padding"]):
        params = _with_padding(layer, pad, count_include_pad=True)
    elif p["type"] == "max" and nonnegative(pad.inputs[0]) and _windows_reach_input(layer, pad):
        params = _with_padding(layer, pad)
    else:
        return None
    return Fused("Padding + Pooling", [pad, layer], "Pooling", [pad.inputs[0]], params, {})


def fuse_residual(network) -> bool:
    """Fuse a residual sum into the Convolution producing one of its operands."""
    return apply_rules(network, {"ElementWise": [residual_sum]}, logger)


def fuse_padding(network) -> bool:
    """Fold zero spatial padding into the Convolution that reads it."""
    return apply_rules(network, {"Convolution": [padding_into_convolution]}, logger)


def fuse_pooling_padding(network) -> bool:
    """Fold zero spatial padding into the Pooling that reads it, where that changes no value."""
    return apply_rules(network, {"Pooling": [padding_into_pooling]}, logger)
