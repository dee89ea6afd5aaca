"""Builder passes: plain functions ``pass_(network) -> bool`` (True when they changed it)."""
from __future__ import annotations

import logging

from tftrt_py.engine.backends.numpy_backend import NumpyBackend

__all__ = ["fold_constants", "eliminate_dead_layers"]

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


def _size(shape):
    n = 1
    for d in shape:
        n *= d
    return n
