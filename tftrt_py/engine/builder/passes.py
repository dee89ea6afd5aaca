"""Builder passes: plain functions ``pass_(network) -> bool`` (True when they changed it)."""
from __future__ import annotations

import logging
from typing import Hashable

import numpy as np

from tftrt_py.engine.backends.numpy_backend import NumpyBackend

__all__ = ["fold_constants", "eliminate_dead_layers", "merge_duplicates"]

logger = logging.getLogger(__name__)

#: Folding a layer whose result is larger than this many elements is not worth the plan size.
MAX_FOLDED_ELEMENTS = 1 << 24


def fold_constants(network) -> bool:
    """Replace every layer whose inputs are all constants by a Constant layer holding its result."""
    changed = False
    backend = NumpyBackend()
    for layer in list(network.layers):
        if layer.kind == "Constant" or not layer.inputs:
            continue
        if not all(t.producer is not None and t.producer.kind == "Constant" for t in layer.inputs):
            continue
        if sum(int(_size(t.shape)) for t in layer.outputs) > MAX_FOLDED_ELEMENTS:
            continue
        values = backend.run_layer(layer, [t.producer.weights["value"] for t in layer.inputs])
        with network.inserting_before(layer):
            for old, value in zip(layer.outputs, values):
                new = network.add_constant(value.astype(old.dtype).reshape(old.shape), name=f"{layer.name} (folded)")
                network.replace_all_uses(old, new)
        network.layers.remove(layer)
        logger.debug("folded constant layer %s", layer.name)
        changed = True
    return changed


def eliminate_dead_layers(network) -> bool:
    """Remove layers none of whose outputs reach a network output."""
    live = {t.name for t in network.outputs}
    keep = []
    for layer in reversed(network.layers):
        if any(t.name in live for t in layer.outputs):
            keep.append(layer)
            live.update(t.name for t in layer.inputs)
        else:
            logger.debug("eliminated dead layer %s", layer.name)
    changed = len(keep) != len(network.layers)
    network.layers = keep[::-1]
    return changed


def _frozen(value) -> Hashable:
    """`value` (params: nested dicts, lists, scalars, arrays) as a hashable key; equal keys, equal values."""
    if isinstance(value, dict):
        return tuple(sorted((k, _frozen(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return tuple(_frozen(v) for v in value)
    if isinstance(value, np.ndarray):
        return "ndarray", value.dtype.str, value.shape, value.tobytes()
    return type(value).__name__, value


#: kinds that only move data, which converters repeat per reader (Keras's Tensordot reshapes its input for each
#: dense layer): merged when equal. Computing kinds are left as built: a fusion may want each its own.
MERGEABLE = ("Shuffle", "Slice", "Identity")


def merge_duplicates(network) -> bool:
    """Data-moving layers doing the same thing (kind, params, the same input tensors) merge into the first one:
    its readers read the first's outputs (e.g. the one reshape of a hidden state that q, k and v projections each
    made, so horizontal fusion sees one input)."""
    changed = False
    first = {}
    for layer in list(network.layers):
        if (layer.kind not in MERGEABLE or layer.weights or not layer.inputs
                or any(network.is_output(t) for t in layer.outputs)):
            continue
        key = (layer.kind, _frozen(layer.params), tuple(id(t) for t in layer.inputs))
        kept = first.setdefault(key, layer)
        if kept is layer:
            continue
        for old, new in zip(layer.outputs, kept.outputs):
            network.replace_all_uses(old, new)
        network.layers.remove(layer)
        logger.debug("merged layer %s into %s", layer.name, kept.name)
        changed = True
    return changed


def _size(shape):
    n = 1
    for d in shape:
        n *= d
    return n
