"""Declarative schemas of layer parameters: what each layer kind accepts, checked in one place.

A kind declares ``{param: spec}`` next to its shape rule (``layers.register(kind, params=...)``); a spec is
a small callable ``spec(value, layer, path)`` raising NetworkError. Params are required unless wrapped in
:func:`optional`; a key the schema does not name is refused. :func:`check` runs a layer's schema: plans
run it on every layer they read, so nothing from a file reaches a backend unchecked.
"""
from __future__ import annotations

import math
import numbers
from typing import Callable, Dict

from tftrt_py.engine.errors import NetworkError

__all__ = ["check", "optional", "boolean", "integer", "number", "one_of", "ints", "axis", "axes",
           "permutation", "record", "list_of", "RANK", "SPATIAL", "MAX_RANK", "MAX_INT"]

Spec = Callable[[object, object, str], None]
#: Most dims a tensor (and so a per-axis param list) has: TensorRT's Dims::MAX_DIMS.
MAX_RANK = 8
#: Largest magnitude of an integer param (sizes, paddings, strides): a tensor's element limit.
MAX_INT = 2 ** 31 - 1


def _bad(path: str, value, expected: str):
    text = repr(value)
    raise NetworkError(f"param {path} is {text if len(text) <= 60 else text[:57] + '...'}, expected {expected}")


def check(layer, schema: Dict[str, Spec]) -> None:
    """Raise NetworkError naming the first param of `layer` that `schema` does not allow."""
    params = layer.params
    if not isinstance(params, dict):
        _bad("params", params, "a dict")
    unknown = sorted(set(params) - set(schema), key=str)
    if unknown:
        raise NetworkError(f"unknown param(s) {unknown} for a {layer.kind} layer (known: {sorted(schema)})")
    for name, spec in schema.items():
        if name not in params and not getattr(spec, "optional", False):
            raise NetworkError(f"a {layer.kind} layer needs param {name!r}")
        if name in params:
            spec(params[name], layer, name)


def optional(spec: Spec) -> Spec:
    """The param may be missing or None."""
    def run(value, layer, path):
        if value is not None:
            spec(value, layer, path)
    run.optional = True
    return run


def _is_int(value) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def boolean(value, layer, path):
    if not isinstance(value, bool):
        _bad(path, value, "true or false")


def integer(lo: int = -MAX_INT, hi: int = MAX_INT) -> Spec:
    def run(value, layer, path):
        if not _is_int(value) or not lo <= value <= hi:
            _bad(path, value, f"an integer in [{lo}, {hi}]")
    return run


def number(lo: float = -math.inf, hi: float = math.inf, finite: bool = True) -> Spec:
    def run(value, layer, path):
        ok = isinstance(value, numbers.Real) and not isinstance(value, bool) and not math.isnan(value)
        if not ok or not lo <= value <= hi or finite and not math.isfinite(value):
            _bad(path, value, f"a {'finite ' if finite else ''}number in [{lo}, {hi}]")
    return run


def one_of(*values) -> Spec:
    def run(value, layer, path):
        if not isinstance(value, str) or value not in values:
            _bad(path, value, f"one of {', '.join(values)}")
    return run


def RANK(layer) -> int:
    """Length rule: the rank of the layer's first input."""
    return layer.inputs[0].rank


def SPATIAL(layer) -> int:
    """Length rule: the spatial dims of a channels-last [N, *S, C] first input."""
    return layer.inputs[0].rank - 2


def list_of(spec: Spec, length=None, max_length: int = MAX_RANK) -> Spec:
    """A list of at most `max_length` items, each `spec`; `length` (an int or a rule of the layer) fixes it."""
    def run(value, layer, path):
        want = length(layer) if callable(length) else length
        if not isinstance(value, list) or len(value) > max_length or want is not None and len(value) != want:
            _bad(path, value, f"a list of {want if want is not None else f'at most {max_length}'} items")
        for i, item in enumerate(value):
            spec(item, layer, f"{path}[{i}]")
    return run


def ints(length=None, lo: int = -MAX_INT, hi: int = MAX_INT, max_length: int = MAX_RANK) -> Spec:
    return list_of(integer(lo, hi), length, max_length)


def axis(value, layer, path):
    """An axis of the first input, negative counting from the end."""
    rank = layer.inputs[0].rank
    if not _is_int(value) or not -rank <= value < max(rank, 1):
        _bad(path, value, f"an axis of a rank-{rank} input")


def axes(value, layer, path):
    """Distinct axes of the first input."""
    list_of(axis, max_length=MAX_RANK)(value, layer, path)
    rank = max(layer.inputs[0].rank, 1)
    if len({a % rank for a in value}) != len(value):
        _bad(path, value, "distinct axes")


def permutation(length=None) -> Spec:
    """A permutation of range(n); `length` (a rule of the layer) fixes n."""
    def run(value, layer, path):
        list_of(integer(0, MAX_RANK - 1), length)(value, layer, path)
        if sorted(value) != list(range(len(value))):
            _bad(path, value, f"a permutation of 0..{len(value) - 1}")
    return run


def record(**fields: Spec) -> Spec:
    """A dict whose keys `fields` declare (wrapped in optional where they may be missing)."""
    def run(value, layer, path):
        if not isinstance(value, dict):
            _bad(path, value, "an object")
        unknown = sorted(set(value) - set(fields), key=str)
        if unknown:
            raise NetworkError(f"param {path} has unknown key(s) {unknown} (known: {sorted(fields)})")
        for name, spec in fields.items():
            if name not in value and not getattr(spec, "optional", False):
                raise NetworkError(f"param {path} needs key {name!r}")
            if name in value:
                spec(value[name], layer, f"{path}.{name}")
    return run
