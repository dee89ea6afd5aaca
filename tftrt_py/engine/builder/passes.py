"""Builder passes: plain functions ``pass_(network) -> bool`` (True when they changed it)."""
from __future__ import annotations

import hashlib
import logging
from typing import Dict, Hashable, List

import numpy as np

from tftrt_py.engine.backends.numpy_backend import NumpyBackend

__all__ = ["fold_constants", "eliminate_dead_layers", "merge_duplicates", "merge_common_subexpressions"]

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

#: Constants up to this many elements are compared by value when merging common subexpressions.
MAX_MERGED_CONSTANT = 1 << 20
#: Elements of a Constant (evenly spaced) whose hash keys it there; constants of equal keys are then compared whole.
#: Hashing every byte took 0.1 s of a keras-hub BERT-base build on an H200 machine's CPU (its twelve 768x768
#: projections, hashed again in each round of the late passes).
SAMPLED_ELEMENTS = 4096


def merge_duplicates(network) -> bool:
    """Data-moving layers doing the same thing (kind, params, the same input tensors) merge into the first one:
    its readers read the first's outputs (e.g. the one reshape of a hidden state that q, k and v projections each
    made, so horizontal fusion sees one input)."""
    return _merge_equal(network, lambda layer: layer.kind in MERGEABLE and not layer.weights and layer.inputs)


def merge_common_subexpressions(network) -> bool:
    """Once fusions have settled (a late pass): any layers computing the same thing (kind, params, equal weights,
    the same input tensors) merge, and so do equal constants (up to MAX_MERGED_CONSTANT elements) — e.g. the
    attention mask a converted GPT-2 rebuilds in each of its 12 blocks from the same padding mask."""
    return _merge_equal(network, lambda layer: layer.kind != "Constant"
                        or layer.weights["value"].size <= MAX_MERGED_CONSTANT)


def _digest(value: np.ndarray) -> tuple:
    """dtype, shape and a hash of up to SAMPLED_ELEMENTS of `value`'s elements, evenly spaced: equal arrays, equal
    digests (unequal ones rarely; _merge_equal compares values whole before merging)."""
    flat = value.reshape(-1)
    sample = np.ascontiguousarray(flat[::max(1, flat.size // SAMPLED_ELEMENTS)])
    return value.dtype.str, value.shape, hashlib.blake2b(sample.tobytes(), digest_size=16).digest()


def _merge_equal(network, eligible) -> bool:
    """Merge each `eligible` layer into the first earlier one doing the same (kind, params, weights of equal
    values, the same input tensors): its readers read that one's outputs. Network outputs stay as they are."""
    changed = False
    kept: Dict[Hashable, List] = {}
    for layer in list(network.layers):
        if not eligible(layer) or any(network.is_output(t) for t in layer.outputs):
            continue
        # Constants (no inputs to tell them apart) by a hash of their value; other weights compared when the rest
        # of the key matches, which their same input tensors make rare.
        weights = tuple((k, _digest(v) if layer.kind == "Constant" else (v.dtype.str, v.shape))
                        for k, v in sorted(layer.weights.items()))
        key = (layer.kind, _frozen(layer.params), weights, tuple(id(t) for t in layer.inputs))
        same = kept.setdefault(key, [])
        first = next((k for k in same if all(np.array_equal(k.weights[n], v) for n, v in layer.weights.items())),
                     None)
        if first is None:
            same.append(layer)
            continue
        for old, new in zip(layer.outputs, first.outputs):
            if new.dynamic_range is None:
                new.dynamic_range = old.dynamic_range
            network.replace_all_uses(old, new)
        network.layers.remove(layer)
        logger.debug("merged layer %s into %s", layer.name, first.name)
        changed = True
    return changed


def _size(shape):
    n = 1
    for d in shape:
        n *= d
    return n
