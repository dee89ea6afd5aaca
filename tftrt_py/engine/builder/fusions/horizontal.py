"""Horizontal fusion: sibling Convolutions or MatrixMultiplies reading the same tensor become one
layer with their output channels concatenated, followed by one Slice per sibling::

    x -> conv_a -> ya           x -> conv_a + conv_b -> Slice -> ya
      \\-> conv_b -> yb    =>                         \\-> Slice -> yb

The Slices keep the siblings' dynamic ranges; the fused output, where each sibling's output has one, takes the
largest (one per-tensor scale covering them all: an INT8 Attention reads a fused QKV projection in place).
"""
from __future__ import annotations

import json
import logging
from typing import Dict, List, Optional, Tuple

import numpy as np

from tftrt_py.engine.backends.base import Backend
from tftrt_py.engine.builder.fusions.match import FLOATS, constant_value, record

__all__ = ["fuse_horizontal"]

logger = logging.getLogger(__name__)


def _key(layer, x) -> Optional[Tuple]:
    """What siblings must share to be computed as one layer (None: `layer` cannot take part)."""
    p, out = layer.params, layer.outputs[0]
    if (layer.inputs[0] is not x or out.dtype not in FLOATS
            or layer.weights.get("bias", np.zeros(out.shape[-1])).shape != (out.shape[-1],)):
        return None
    shared = json.dumps([p.get("activation"), out.dtype], sort_keys=True)
    if layer.kind == "Convolution":
        if len(layer.inputs) > 1 or p.get("groups", 1) != 1:
            return None
        k = layer.weights["kernel"]
        return ("Convolution", shared, k.shape[:-1], *(tuple(p[a]) for a in ("strides", "dilations", "pre_padding",
                                                                               "post_padding")))
    b = constant_value(layer.inputs[1]) if layer.kind == "MatrixMultiply" and len(layer.inputs) == 2 else None
    if b is None or b.ndim != 2:
        return None
    flags = (bool(p.get("transpose_a")), bool(p.get("transpose_b")))
    return ("MatrixMultiply", shared, flags, b.shape[1 if flags[1] else 0])


def _covering_range(outs) -> Optional[float]:
    """The largest of the dynamic ranges of `outs`, or None when one of them has none."""
    ranges = [t.dynamic_range for t in outs]
    return None if any(r is None for r in ranges) else max(ranges)


def _merge(network, group: List) -> None:
    """Replace `group` (siblings, in network order) by one layer and a Slice per sibling."""
    first, users = group[0], network.consumers()  # (one scan of the network, not two a sibling)
    outs = [l.outputs[0] for l in group]
    bias = np.concatenate([l.weights.get("bias", np.zeros(o.shape[-1], o.dtype)) for l, o in zip(group, outs)])
    name = " + ".join(l.name for l in group)
    with network.inserting_before(first):
        if first.kind == "Convolution":
            kernel = np.concatenate([l.weights["kernel"] for l in group], axis=-1)
            fused = network.add_layer("Convolution", first.inputs, first.params, {"kernel": kernel, "bias": bias},
                                      name=name)
        else:
            axis = -2 if first.params.get("transpose_b") else -1
            b = network.add_constant(np.concatenate([constant_value(l.inputs[1]) for l in group], axis=axis),
                                     name=f"{name} (weights)")
            fused = network.add_layer("MatrixMultiply", [first.inputs[0], b], first.params, {"bias": bias}, name=name)
        fused.outputs[0].dynamic_range = _covering_range(outs)
        start = 0
        for layer, out in zip(group, outs):
            rank = out.rank
            params = {"start": [0] * (rank - 1) + [start], "size": list(out.shape), "stride": [1] * rank}
            piece = network.add_layer("Slice", fused.outputs, params, name=f"{layer.name} (split)").outputs[0]
            start += out.shape[-1]
            readers = users.pop(out.name, [])
            network.replace_all_uses(out, piece, readers)
            users[piece.name] = readers
            network.erase(layer, users)
            if network.is_output(piece):
                piece.name = out.name
    logger.info("horizontal %s: %s", first.kind, fused.name)
    record(network, f"horizontal {first.kind}")


def fuse_horizontal(network, kinds: Tuple[str, ...] = Backend.horizontal_kinds) -> bool:
    """Merge each group of compatible sibling Convolutions (or MatrixMultiplies with constant B), of `kinds` only
    (a backend's Backend.horizontal_kinds)."""
    users = network.consumers()
    groups: Dict[Tuple, List] = {}
    for x in network.inputs + [t for l in network.layers for t in l.outputs]:
        for layer in users.get(x.name, ()):
            key = _key(layer, x) if layer.kind in kinds else None
            if key is not None and all(layer is not l for l in groups.get((x.name, key), ())):
                groups.setdefault((x.name, key), []).append(layer)
    merged = [g for g in groups.values() if len(g) > 1]
    for group in merged:
        _merge(network, group)
    return bool(merged)
