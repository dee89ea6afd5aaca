"""What the fusion rules share: matching helpers, the rewrite of a match, and fusion counts.

A rule is ``rule(network, users, layer) -> Fused | Bypass | None``: it tries to match a pattern
ending at `layer` (the root) and returns how to rewrite it, or None. :func:`apply_rules` runs
rules indexed by root layer kind over a network; a match replaces the root's output and erases
the matched layers, so every intermediate must be private to the pattern (see :func:`private`).
"""
from __future__ import annotations

import collections
import dataclasses
import logging
import weakref
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

from tftrt_py.engine.network import Layer, Network, Tensor

__all__ = ["Fused", "Bypass", "Rule", "apply_rules", "record", "fusion_counts", "constant_value", "produced_by",
           "private", "sole_producer", "squared", "channel_vector", "affine", "activation_of", "with_activation",
           "bias_key", "gemm_residual", "reshape_only", "BIASED", "GEMM_OPERANDS", "FLOATS"]

logger = logging.getLogger(__name__)

FLOATS = ("float32", "float16")
Users = Mapping[str, List[Layer]]


@dataclasses.dataclass
class Fused:
    """`layers` (in network order; the last one's output is replaced) become one new layer."""

    rule: str
    layers: List[Layer]
    kind: str
    inputs: List[Tensor]
    params: dict
    weights: Dict[str, np.ndarray]
    name: Optional[str] = None


@dataclasses.dataclass
class Bypass:
    """`layers` compute nothing: readers of the last one's output read `tensor` instead."""

    rule: str
    layers: List[Layer]
    tensor: Tensor


Rule = Callable[[Network, Users, Layer], Union[Fused, Bypass, None]]


# -- matching helpers ---------------------------------------------------------
def constant_value(tensor: Tensor) -> Optional[np.ndarray]:
    """The value of a tensor made by a Constant layer, else None."""
    p = tensor.producer
    return p.weights["value"] if p is not None and p.kind == "Constant" else None


def produced_by(tensor: Tensor, kind: str, *ops: str) -> Optional[Layer]:
    """The producer of `tensor` when it is of `kind` (and has one of `ops` as its op, when given), else None."""
    p = tensor.producer
    return p if p is not None and p.kind == kind and (not ops or p.params.get("op") in ops) else None


def private(network: Network, users: Users, tensor: Tensor, inside: Sequence[Layer]) -> bool:
    """True when only layers of `inside` read `tensor` and it is no network output."""
    return not network.is_output(tensor) and all(any(u is l for l in inside) for u in users.get(tensor.name, ()))


def sole_producer(network: Network, users: Users, tensor: Tensor, kinds: Sequence[str]) -> Optional[Layer]:
    """The producer of `tensor` when it is of one of `kinds` and `tensor` has one reader and is no output."""
    p = tensor.producer
    if p is None or p.kind not in kinds or len(users.get(tensor.name, ())) != 1 or network.is_output(tensor):
        return None
    return p


def squared(layer: Layer) -> Optional[Tensor]:
    """x when `layer` computes x * x (Unary square, ElementWise x * x or x ** 2), else None."""
    if layer.kind == "Unary":
        return layer.inputs[0] if layer.params["op"] == "square" else None
    if layer.kind != "ElementWise":
        return None
    a, b = layer.inputs
    op, c = layer.params["op"], constant_value(b)
    return a if op == "prod" and a is b or op == "pow" and c is not None and c.size == 1 and c.item() == 2 else None


#: (ElementWise op, index of the constant operand) -> (scale, shift) that op applies, given the constant c
AFFINE_OPS = {
    ("sum", 0): lambda c: (1.0, c), ("sum", 1): lambda c: (1.0, c),
    ("sub", 0): lambda c: (-1.0, c), ("sub", 1): lambda c: (1.0, -c),
    ("prod", 0): lambda c: (c, 0.0), ("prod", 1): lambda c: (c, 0.0),
    ("div", 1): lambda c: (1.0 / c, 0.0),
}


def channel_vector(value: np.ndarray, rank: int, channels: int) -> Optional[np.ndarray]:
    """`value` as a float64 [channels] vector when it varies along the last of `rank` axes at most."""
    if value.ndim > rank or any(d != 1 for d in value.shape[:-1]) or value.size not in (1, channels):
        return None
    return np.broadcast_to(value.astype(np.float64).reshape(-1), (channels,))


def affine(layer: Layer, activated: bool = False) -> Optional[Tuple[Tensor, np.ndarray, np.ndarray]]:
    """(x, scale, shift) when `layer` computes x * scale + shift with [C] vectors over x's last axis.

    Matches a Scale (per last-axis channel or uniform, power 1, no activation unless `activated`: then the
    activation comes after the affine) and an ElementWise sum/sub/prod/div with such a constant that does not
    broadcast x.
    """
    out = layer.outputs[0]
    if out.dtype not in FLOATS:
        return None
    channels = out.shape[-1] if out.rank else 1
    if layer.kind == "Scale":
        x, w = layer.inputs[0], layer.weights
        if (layer.params.get("activation") and not activated) or np.any(w.get("power", 1) != 1):
            return None
        if x.rank and layer.params.get("channel_axis", -1) % x.rank != x.rank - 1 and any(
                w[k].size > 1 for k in ("scale", "shift") if k in w):
            return None
        vectors = [channel_vector(np.asarray(w.get(k, v)), x.rank, channels) for k, v in (("scale", 1.0),
                                                                                         ("shift", 0.0))]
        return None if any(v is None for v in vectors) else (x, *vectors)
    if layer.kind != "ElementWise":
        return None
    for i, t in enumerate(layer.inputs):
        c, x = constant_value(t), layer.inputs[1 - i]
        fn = AFFINE_OPS.get((layer.params["op"], i))
        if c is None or fn is None or constant_value(x) is not None or x.shape != out.shape:
            continue
        c = channel_vector(c, x.rank, channels)
        if c is None or (layer.params["op"] == "div" and not np.all(c)):
            return None
        scale, shift = fn(c)
        return x, np.broadcast_to(scale, (channels,)), np.broadcast_to(shift, (channels,))
    return None


# -- the epilogue (bias and activation) of Convolution, MatrixMultiply, MLP and Scale -------
def activation_of(layer: Layer) -> Optional[dict]:
    return layer.params["activations"][-1] if layer.kind == "MLP" else layer.params.get("activation")


def with_activation(layer: Layer, activation: dict) -> dict:
    """`layer`'s params with `activation` applied last."""
    if layer.kind == "MLP":
        return {**layer.params, "activations": layer.params["activations"][:-1] + [activation]}
    return {**layer.params, "activation": activation}


def reshape_only(layer: Layer) -> bool:
    """A Shuffle that only reshapes (no transposes): elements keep their memory order."""
    return layer.kind == "Shuffle" and all(
        layer.params.get(k) is None or list(layer.params[k]) == list(range(len(layer.params[k])))
        for k in ("first_perm", "second_perm"))


def bias_key(layer: Layer) -> str:
    return f"b{len(layer.params['activations']) - 1}" if layer.kind == "MLP" else "bias"


#: kinds whose output can absorb a bias; only Convolution also absorbs a scale (into its kernel)
BIASED = ("Convolution", "MatrixMultiply", "MLP")

#: GEMM kinds and how many inputs they take before an optional residual (added before their activation).
GEMM_OPERANDS = {"MatrixMultiply": 2, "MLP": 1}


def gemm_residual(layer: Layer) -> Optional[Tensor]:
    """The residual input of a MatrixMultiply or MLP layer, or None."""
    n = GEMM_OPERANDS.get(layer.kind)
    return layer.inputs[n] if n is not None and len(layer.inputs) > n else None


# -- rewriting ----------------------------------------------------------------
def _forget_reads(users: Dict[str, List[Layer]], layer: Layer) -> None:
    """Drop `layer`'s reads from `users` (one entry per input slot, as Network.consumers lists them)."""
    for t in layer.inputs:
        readers = users.get(t.name, [])
        for i, reader in enumerate(readers):
            if reader is layer:
                del readers[i]
                break


def _rewrite(network: Network, users: Dict[str, List[Layer]], match: Union[Fused, Bypass]) -> str:
    """Apply `match` to `network`, keeping `users` (its consumers map) up to date: a sweep reads it after
    every rewrite, and recomputing it would make a sweep quadratic in the network's size."""
    root = match.layers[-1]
    old = root.outputs[0]
    if isinstance(match, Bypass):
        new, name = match.tensor, f"{' + '.join(l.name for l in match.layers)} (erased)"
    else:
        name = match.name or " + ".join(l.name for l in match.layers)
        with network.inserting_before(root):
            layer = network.add_layer(match.kind, match.inputs, match.params, match.weights, name=name)
        for t in layer.inputs:
            users.setdefault(t.name, []).append(layer)
        new, name = layer.outputs[0], layer.name
        new.dynamic_range = old.dynamic_range
    readers = users.pop(old.name, [])
    network.replace_all_uses(old, new, readers)
    users.setdefault(new.name, []).extend(readers)
    for layer in reversed(match.layers):
        network.erase(layer, users)
        _forget_reads(users, layer)
    if network.is_output(new) and isinstance(match, Fused):  # the new output takes over the binding name
        users[old.name] = users.pop(new.name)
        new.name = old.name
    return name


def apply_rules(network: Network, rules: Mapping[str, Sequence[Rule]], log: logging.Logger) -> bool:
    """One sweep over the network trying `rules` (by root kind) at each layer; True if any matched."""
    changed = False
    users = network.consumers()
    for layer in list(network.layers):
        for rule in rules.get(layer.kind, ()):
            match = rule(network, users, layer)
            if match is None or (isinstance(match, Bypass) and network.is_output(layer.outputs[0])):
                continue
            log.info("%s: %s", match.rule, _rewrite(network, users, match))
            record(network, match.rule)
            changed = True
            break
    return changed


# -- counts -------------------------------------------------------------------
_COUNTS: "weakref.WeakKeyDictionary[Network, collections.Counter]" = weakref.WeakKeyDictionary()


def record(network: Network, rule: str) -> None:
    """Count one application of `rule` on `network`."""
    _COUNTS.setdefault(network, collections.Counter())[rule] += 1


def fusion_counts(network: Network) -> Dict[str, int]:
    """How often each fusion rule was applied to `network` so far."""
    return dict(_COUNTS.get(network, {}))
