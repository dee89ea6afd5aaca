"""A pointwise projection after an upsampling moves before it, where it then costs less::

    x [N, H, W, Cin] -> Resize -> [N, H', W', Cin] -> Convolution 1x1 (Cin -> Cout) -> y
        =>   x -> Convolution 1x1 -> [N, H, W, Cout] -> Resize -> y

A segmentation head's last upsampling of its features followed by their projection to class logits computes the
projection at every output pixel, on Cin channels; moved, it runs at the input's resolution and the Resize carries
Cout channels (DeepLabV3 upsampling 256 channels 4x before a projection to 3 classes spent ~60% of its engine on
the CPU there). A Resize (nearest or linear) maps each channel by fixed weights summing to one, and the projection
mixes the channels of each pixel, so the two commute: nearest exactly, linear up to rounding (a bias moves through
as the interpolation of a constant). NaN and infinities stay where TF's order puts them: TF's lerp gives NaN
wherever a non-finite value is an upper-left, upper-right or lower-left neighbour (or one with a zero weight), and
where the lower-right neighbour alone is one it keeps that value's sign, times the projection's either way.
"""
from __future__ import annotations

import logging
from typing import Optional

from tftrt_py.engine.builder.fusions.match import record, sole_producer
from tftrt_py.engine.network import Layer

__all__ = ["project_before_resize"]

logger = logging.getLogger(__name__)


def _pointwise(layer: Layer) -> bool:
    """A Convolution that mixes each pixel's channels only, adding at most its bias (no residual, activation,
    padding, stride, dilation or groups)."""
    p, k = layer.params, layer.weights["kernel"]
    return (len(layer.inputs) == 1 and not p.get("activation") and p.get("groups", 1) == 1 and k.ndim == 4
            and k.shape[:2] == (1, 1) and all(v == 1 for v in p["strides"] + p["dilations"])
            and not any(p["pre_padding"] + p["post_padding"]))


def _upsampling(network, users, conv: Layer) -> Optional[Layer]:
    """The Resize that only `conv` reads, when `conv` is pointwise and does less work before it than after it;
    tensors with INT8 ranges keep their order (the ranges were measured on it)."""
    resize = sole_producer(network, users, conv.inputs[0], ("Resize",))
    if resize is None or not _pointwise(conv):
        return None
    x, up, y = resize.inputs[0], resize.outputs[0], conv.outputs[0]
    if x.dtype != up.dtype or any(t.dynamic_range is not None for t in (x, up, y)):
        return None
    (_, h, w, cin), (_, oh, ow, cout) = x.shape, y.shape
    before = oh * ow * cin * (1 + cout)  # the Resize on Cin channels, then the projection at H' x W'
    after = h * w * cin * cout + oh * ow * cout
    return resize if after < before else None


def project_before_resize(network) -> bool:
    """Move each pointwise Convolution that reads an upsampling Resize before that Resize (see the module)."""
    users = network.consumers()
    changed = False
    for conv in [layer for layer in network.layers if layer.kind == "Convolution"]:
        resize = _upsampling(network, users, conv)
        if resize is None:
            continue
        old = conv.outputs[0]
        with network.inserting_before(resize):
            projected = network.add_layer("Convolution", resize.inputs, conv.params, conv.weights, name=conv.name)
            new = network.add_layer("Resize", projected.outputs, resize.params, name=resize.name).outputs[0]
        network.replace_all_uses(old, new)
        network.erase(conv)
        network.erase(resize)
        if network.is_output(new):  # the output keeps its binding name
            new.name = old.name
        users = network.consumers()
        logger.info("projection before resize: %s", conv.name)
        record(network, "projection before resize")
        changed = True
    return changed
