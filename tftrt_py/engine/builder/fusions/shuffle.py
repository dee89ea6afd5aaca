"""Shuffle fusions: a Shuffle that moves nothing erased, two composed into one (or erased), and a
permuting Shuffle folded into a Reduce.

A Shuffle is a first transpose, a reshape, then a second transpose (each optional); a
permutation ``p`` maps output axis i to input axis p[i], and None is the identity.
"""
from __future__ import annotations

import logging
from typing import Optional, Sequence

import numpy as np

from tftrt_py.engine.reference import KERNELS
from tftrt_py.engine.builder.fusions.match import Bypass, Fused, apply_rules, sole_producer
from tftrt_py.engine.layer_geometry import shuffle_shapes

__all__ = ["fuse_shuffles", "then"]

logger = logging.getLogger(__name__)


def then(p: Optional[Sequence[int]], q: Optional[Sequence[int]]) -> Optional[list]:
    """The permutation of transposing by `p`, then by `q` (None when that is the identity)."""
    r = q if p is None else p if q is None else [p[i] for i in q]
    return None if r is None or list(r) == sorted(r) else list(r)


def _compose(first, second) -> Optional[dict]:
    """One Shuffle's params doing `first` then `second` (layers), or None when the seed's rule forbids it:
    both reshape and the first's second transpose is not undone by the second's first transpose."""
    a1, r1, b1 = (first.params.get(k) for k in ("first_perm", "reshape", "second_perm"))
    a2, r2, b2 = (second.params.get(k) for k in ("first_perm", "reshape", "second_perm"))
    if r1 is None:
        a, r, b, src = then(then(a1, b1), a2), r2, b2, second
    elif r2 is None:
        a, r, b, src = a1, r1, then(b1, then(a2, b2)), first
    elif then(b1, a2) is None:
        a, r, b, src = a1, r2, b2, second
    else:
        return None
    if r is not None:  # concrete dims; dropped when they keep the shape
        r = list(shuffle_shapes(src.inputs[0].shape, {"first_perm": src.params.get("first_perm"), "reshape": r}))
        before = shuffle_shapes(first.inputs[0].shape, {"first_perm": a})
        r = None if tuple(r) == before else r
    if r is None:
        a, b = then(a, b), None
    return {k: v for k, v in (("first_perm", a), ("reshape", r), ("second_perm", b)) if v is not None}


def identity_shuffle(network, users, layer):
    """x -> Shuffle that leaves every element in place -> y   =>   readers of y read x"""
    x = layer.inputs[0]
    if layer.outputs[0].shape != x.shape:
        return None
    index = np.arange(int(np.prod(x.shape))).reshape(x.shape)
    if not np.array_equal(KERNELS["Shuffle"](layer, [index])[0], index):
        return None
    return Bypass("Shuffle erasure", [layer], x)


def shuffle_shuffle(network, users, layer):
    """x -> Shuffle -> Shuffle -> y   =>   x -> Shuffle -> y, or y is x when nothing is left (and y is
    no network output)."""
    first = sole_producer(network, users, layer.inputs[0], ("Shuffle",))
    params = None if first is None else _compose(first, layer)
    if params is None:
        return None
    if not params and not network.is_output(layer.outputs[0]):
        return Bypass("Shuffle + Shuffle", [first, layer], first.inputs[0])
    return Fused("Shuffle + Shuffle", [first, layer], "Shuffle", first.inputs, params, {})


def shuffle_reduce(network, users, layer):
    """x -> Shuffle(permutation only) -> Reduce(keep dims) -> y   =>   x -> Reduce(first_perm) -> y"""
    shuffle = sole_producer(network, users, layer.inputs[0], ("Shuffle",))
    if shuffle is None or shuffle.params.get("reshape") is not None or not layer.params.get("keep_dims"):
        return None
    perm = then(then(shuffle.params.get("first_perm"), shuffle.params.get("second_perm")),
                layer.params.get("first_perm"))
    params = {k: v for k, v in layer.params.items() if k != "first_perm"}
    if perm is not None:
        params["first_perm"] = perm
    return Fused("Shuffle + Reduce", [shuffle, layer], "Reduce", shuffle.inputs, params, {})


def fuse_shuffles(network) -> bool:
    """Erase Shuffles that change nothing, compose consecutive ones, fold permutations into keep-dims Reduces."""
    return apply_rules(network, {"Shuffle": [identity_shuffle, shuffle_shuffle], "Reduce": [shuffle_reduce]}, logger)
