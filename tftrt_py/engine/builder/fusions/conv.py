"""Convolution fusions: a residual ElementWise sum, and a zero Padding in front."""
from __future__ import annotations

import logging

from tftrt_py.engine.builder.fusions.match import Fused, activation_of, apply_rules, sole_producer

__all__ = ["fuse_residual", "fuse_padding"]

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


def padding_into_convolution(network, users, layer):
    """Padding(zeros, spatial axes only) -> Convolution   =>   Convolution with the padding added to its own."""
    pad = sole_producer(network, users, layer.inputs[0], ("Padding",))
    if pad is None:
        return None
    p = pad.params
    if (p.get("mode", "constant") != "constant" or p.get("value", 0) != 0 or min(p["pre"] + p["post"]) < 0
            or p["pre"][0] or p["post"][0] or p["pre"][-1] or p["post"][-1]):
        return None
    params = dict(layer.params, pre_padding=[a + b for a, b in zip(layer.params["pre_padding"], p["pre"][1:-1])],
                  post_padding=[a + b for a, b in zip(layer.params["post_padding"], p["post"][1:-1])])
    return Fused("Padding + Convolution", [pad, layer], "Convolution", [pad.inputs[0], *layer.inputs[1:]], params,
                 layer.weights)


def fuse_residual(network) -> bool:
    """Fuse a residual sum into the Convolution producing one of its operands."""
    return apply_rules(network, {"ElementWise": [residual_sum]}, logger)


def fuse_padding(network) -> bool:
    """Fold zero spatial padding into the Convolution that reads it."""
    return apply_rules(network, {"Convolution": [padding_into_convolution]}, logger)
