"""Convolution fusions: a residual ElementWise sum, a zero Padding in front (also of a Pooling), and the
space-to-batch rearrangements TF wraps around a dilated convolution."""
from __future__ import annotations

import logging

from typing import List, Optional, Sequence

from tftrt_py.engine.builder.fusions.activation import nonnegative
from tftrt_py.engine.builder.fusions.match import Fused, activation_of, apply_rules, sole_producer
from tftrt_py.engine.errors import NetworkError
from tftrt_py.engine.layer_geometry import batch_to_space_layers, space_to_batch_layers
from tftrt_py.engine.network import Layer

__all__ = ["fuse_residual", "fuse_padding", "fuse_pooling_padding", "fuse_atrous"]

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


def _is(layers: Sequence[Layer], specs) -> bool:
    """Whether `layers` are the (kind, params) `specs`, one for one (params set to None count as absent)."""
    return len(layers) == len(specs) and all(
        layer.kind == kind and {k: list(v) if isinstance(v, (list, tuple)) else v
                                for k, v in layer.params.items() if v is not None} == params
        for layer, (kind, params) in zip(layers, specs))


def _private_chain(network, users, tensor, kinds, most: int) -> List[Layer]:
    """The layers of `kinds` (at most `most`) that make `tensor` from the end, each read only by the next, in
    network order."""
    chain: List[Layer] = []
    while len(chain) < most:
        p = sole_producer(network, users, tensor, kinds)
        if p is None:
            break
        chain.insert(0, p)
        tensor = p.inputs[0]
    return chain


def atrous_convolution(network, users, layer):
    """x -> SpaceToBatch(block b, padding p) -> Convolution(stride 1, no dilation, no padding) -> BatchToSpace(b,
    crops c) -> y   =>   x -> Convolution(dilation b, padding p - c) -> y: how TF writes a dilated convolution
    (the rearrangements as space_to_batch_layers / batch_to_space_layers lay them out; `layer` ends the second).
    A BatchToSpace's last Shuffle read by the Slice of its crops leaves the match to that Slice."""
    readers = users.get(layer.outputs[0].name, [])
    if (layer.kind == "Shuffle" and len(readers) == 1 and readers[0].kind == "Slice"
            and not network.is_output(layer.outputs[0]) and _atrous(network, users, readers[0]) is not None):
        return None
    return _atrous(network, users, layer)


def _atrous(network, users, layer) -> Optional[Fused]:
    after = _private_chain(network, users, layer.inputs[0], ("Shuffle",), 2 if layer.kind == "Slice" else 1)
    after.append(layer)
    conv = sole_producer(network, users, after[0].inputs[0], ("Convolution",))
    if conv is None or len(conv.inputs) != 1:
        return None
    p, m = conv.params, len(conv.params["strides"])
    if any(v != 1 for v in p["strides"] + p["dilations"]) or any(p["pre_padding"] + p["post_padding"]):
        return None
    block = list(after[0].params.get("reshape") or [])[:m]
    crop_pre, crop_post = [0] * m, [0] * m
    if layer.kind == "Slice":
        crop_pre = list(layer.params["start"][1:1 + m])
        full, kept = layer.inputs[0].shape[1:1 + m], layer.params["size"][1:1 + m]
        crop_post = [f - a - n for f, a, n in zip(full, crop_pre, kept)]
    before = _private_chain(network, users, conv.inputs[0], ("Shuffle", "Padding"), 3)
    if len(block) != m or min(block, default=0) < 1 or len(before) < 2:
        return None
    if before[0].kind != "Padding":
        before = before[-2:]
    x = before[0].inputs[0]
    pad_pre = list(before[0].params["pre"][1:1 + m]) if before[0].kind == "Padding" else [0] * m
    pad_post = list(before[0].params["post"][1:1 + m]) if before[0].kind == "Padding" else [0] * m
    try:
        if not (_is(after, batch_to_space_layers(conv.outputs[0].shape, block, crop_pre, crop_post))
                and _is(before, space_to_batch_layers(x.shape, block, pad_pre, pad_post))):
            return None
    except NetworkError:
        return None
    pre, post = [a - c for a, c in zip(pad_pre, crop_pre)], [a - c for a, c in zip(pad_post, crop_post)]
    if min(pre + post) < 0:
        return None
    return Fused("atrous convolution", [*before, conv, *after], "Convolution", [x],
                 dict(p, dilations=block, pre_padding=pre, post_padding=post), conv.weights)


def fuse_residual(network) -> bool:
    """Fuse a residual sum into the Convolution producing one of its operands."""
    return apply_rules(network, {"ElementWise": [residual_sum]}, logger)


def fuse_padding(network) -> bool:
    """Fold zero spatial padding into the Convolution that reads it."""
    return apply_rules(network, {"Convolution": [padding_into_convolution]}, logger)


def fuse_pooling_padding(network) -> bool:
    """Fold zero spatial padding into the Pooling that reads it, where that changes no value."""
    return apply_rules(network, {"Pooling": [padding_into_pooling]}, logger)


def fuse_atrous(network) -> bool:
    """Turn each convolution TF wrapped in space-to-batch rearrangements back into one dilated Convolution."""
    return apply_rules(network, {"Shuffle": [atrous_convolution], "Slice": [atrous_convolution]}, logger)
