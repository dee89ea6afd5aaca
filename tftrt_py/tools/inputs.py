"""Input arrays for the tools: .npy / .npz files, synthetic (seeded random) data, --shapes overrides.

Imports no TensorFlow.
"""
from __future__ import annotations

import os
import re
from typing import Dict, List, Mapping, Sequence, Tuple, Union

import numpy as np

__all__ = ["InputError", "parse_shape_override", "load_arrays", "synthetic", "bind"]

Arrays = Union[List[np.ndarray], Dict[str, np.ndarray]]
_POSITIONAL = re.compile(r"arr_(\d+)$")


class InputError(ValueError):
    """An input file, shape or binding is missing or does not fit."""


def parse_shape_override(text: str) -> Tuple[str, Tuple[int, ...]]:
    """``name:1x32x32x3`` -> (name, (1, 32, 32, 3)); ``name:`` (or ``name:scalar``) is a scalar."""
    name, sep, dims = text.rpartition(":")
    if not sep or not name:
        raise InputError(f"shape override {text!r} is not NAME:DIMS (for example image:1x32x32x3)")
    if dims in ("", "scalar"):
        return name, ()
    try:
        shape = tuple(int(d) for d in dims.lower().split("x"))
    except ValueError:
        raise InputError(f"shape override {text!r}: dims must be integers joined by 'x' (for example "
                         f"1x32x32x3)") from None
    if any(d < 0 for d in shape):
        raise InputError(f"shape override {text!r} has a negative dimension")
    return name, shape


def load_arrays(path: str) -> Arrays:
    """A .npy file -> [array]; a .npz file -> {name: array}, or a list when its keys are arr_0, arr_1, ..."""
    if not os.path.isfile(path):
        raise InputError(f"input file {path!r} does not exist")
    try:
        data = np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError) as exc:
        raise InputError(f"cannot read {path!r} as a .npy or .npz file: {exc}") from None
    if isinstance(data, np.ndarray):
        return [data]
    with data:
        arrays = {k: data[k] for k in data.files}
    if not arrays:
        raise InputError(f"{path!r} holds no arrays")
    indices = [_POSITIONAL.match(k) for k in arrays]
    if all(indices):
        return [arrays[k] for k in sorted(arrays, key=lambda k: int(_POSITIONAL.match(k).group(1)))]
    return arrays


def synthetic(specs: Sequence[Tuple[str, str, Sequence[int]]], seed: int = 0) -> Dict[str, np.ndarray]:
    """Seeded random arrays for (name, dtype, shape) specs: normal floats, small ints, random bools."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, dtype, shape in specs:
        dtype = np.dtype(dtype)
        if dtype.kind == "f":
            value = rng.standard_normal(shape).astype(dtype)
        elif dtype.kind in "iu":
            value = rng.integers(0, 10, size=shape).astype(dtype)
        elif dtype.kind == "b":
            value = rng.random(shape) > 0.5
        else:
            raise InputError(f"cannot make synthetic data for input {name!r} of dtype {dtype}; give it in an "
                             f".npz file")
        out[name] = value
    return out


def bind(arrays: Arrays, names: Sequence[str], what: str = "input") -> Dict[str, np.ndarray]:
    """Arrays (a list in `names` order, or a dict by name) as a dict keyed by `names`."""
    if isinstance(arrays, Mapping):
        unknown = sorted(set(arrays) - set(names))
        missing = [n for n in names if n not in arrays]
        if unknown or missing:
            raise InputError(f"{what} arrays are named {sorted(arrays)}; expected {list(names)}")
        return {n: arrays[n] for n in names}
    if len(arrays) != len(names):
        raise InputError(f"got {len(arrays)} {what} array(s), expected {len(names)} ({list(names)})")
    return dict(zip(names, arrays))
