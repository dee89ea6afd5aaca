"""Layer normalization fusion: the Reduce-based LayerNorm subgraph as one Normalization layer, the ElementWise
residual sum in front of it as its second input, and per-channel affines after it folded into its scale and bias.

With mean = Reduce mean(x) and var = Reduce mean((x - mean)^2) over the last axis (keep dims), the square as
squared_difference(x, mean), d * d, d ** 2 or Unary square of d = x - mean, and r = rsqrt(var + eps) (or recip
or 1 / of sqrt(var + eps); eps a scalar constant, or none: 0), two forms are recognized:

* centered (BERT): d * r, or d / sqrt(var + eps);
* TF's batch_normalization (Keras LayerNormalization): x * m + (beta - mean * m) with m = gamma * r (or r),
  the offset also as beta + (-mean) * m or -mean * m.
"""
from __future__ import annotations

import logging
from typing import List, Optional, Tuple

import numpy as np

from tftrt_py.engine.builder.fusions.match import (AFFINE_OPS, FLOATS, Fused, affine, apply_rules, channel_vector,
                                                   constant_value, private, produced_by, sole_producer, squared)
from tftrt_py.engine.network import Layer, Tensor

__all__ = ["fuse_layer_norms"]

logger = logging.getLogger(__name__)

#: (x, mean Reduce, epsilon, layers computing 1 / sqrt(var + epsilon))
Statistics = Tuple[Tensor, Layer, float, List[Layer]]


def _orders(layer):
    """The two operand orders of a two-input layer."""
    return layer.inputs, layer.inputs[::-1]


def _mean(t: Tensor, x: Optional[Tensor] = None) -> Optional[Layer]:
    """The Reduce making `t` when it is a keep-dims mean over the last axis (of `x`, when given)."""
    r = produced_by(t, "Reduce", "mean")
    if r is None or not r.params.get("keep_dims") or r.params.get("first_perm") is not None:
        return None
    src = r.inputs[0]
    last = src.rank and src.shape[-1] and [a % src.rank for a in r.params["axes"]] == [src.rank - 1]
    return r if last and src.dtype in FLOATS and (x is None or src is x) else None


def _centered(t: Tensor) -> Optional[Tuple[Tensor, Layer, Layer]]:
    """(x, mean Reduce, the sub) when `t` = x - mean(x) has x's shape."""
    sub = produced_by(t, "ElementWise", "sub")
    mean = sub and _mean(sub.inputs[1], sub.inputs[0])
    return (sub.inputs[0], mean, sub) if mean and t.shape == sub.inputs[0].shape else None


def _squared_deviation(t: Tensor) -> Optional[Tuple[Tensor, Layer, List[Layer]]]:
    """(x, mean Reduce, layers) when `t` = (x - mean(x))^2 has x's shape."""
    p = t.producer
    if p is None:
        return None
    if p.kind == "ElementWise" and p.params["op"] == "squared_difference":
        for x, m in _orders(p):
            mean = _mean(m, x)
            if mean and t.shape == x.shape:
                return x, mean, [mean, p]
        return None
    centered = squared(p) is not None and _centered(squared(p))
    return (centered[0], centered[1], [centered[1], centered[2], p]) if centered else None


def _statistics(u: Tensor, layers: List[Layer]) -> Optional[Statistics]:
    """When `u` = var + epsilon (a scalar constant; var alone: epsilon 0, as BERT's 1e-12 in fp16), the statistics,
    `layers` (reading u) added to theirs."""
    add = produced_by(u, "ElementWise", "sum")
    candidates = [(var, constant_value(c), [add]) for var, c in _orders(add)] if add else [(u, np.zeros(1), [])]
    for var, eps, add_layers in candidates:
        reduce = _mean(var)
        deviation = reduce and eps is not None and eps.size == 1 and var.shape == u.shape and _squared_deviation(
            reduce.inputs[0])
        if deviation:
            x, mean, found = deviation
            return x, mean, float(eps.item()), found + [reduce] + add_layers + layers
    return None


def _inverse_std(t: Tensor) -> Optional[Statistics]:
    """The statistics when `t` = 1 / sqrt(var + epsilon): Unary rsqrt, or Unary recip or 1 / . of a Unary sqrt."""
    p = t.producer
    if p is None:
        return None
    if p.kind == "Unary" and p.params["op"] == "rsqrt":
        return _statistics(p.inputs[0], [p])
    reciprocal = (p.kind == "Unary" and p.params["op"] == "recip" or p.kind == "ElementWise" and p.params["op"] == "div"
                  and np.all(constant_value(p.inputs[0]) == 1))
    root = reciprocal and produced_by(p.inputs[-1], "Unary", "sqrt")
    return _statistics(root.inputs[0], [root, p]) if root else None


def _fused(x: Tensor, eps: float, layers: List[Layer], network, users, gamma=None, beta=None) -> Optional[Fused]:
    """The Normalization replacing `layers` (the last one's output), when their other outputs stay inside."""
    out = layers[-1].outputs[0]
    unique = sorted({id(l): l for l in layers}.values(), key=network.layers.index)
    if out.shape != x.shape or out.dtype != x.dtype or not all(
            private(network, users, l.outputs[0], unique) for l in unique if l is not layers[-1]):
        return None
    c = x.shape[-1]
    weights = {"scale": np.ones(c) if gamma is None else gamma, "bias": np.zeros(c) if beta is None else beta}
    return Fused("layer normalization", unique, "Normalization", [x], {"epsilon": eps},
                 {k: np.asarray(v, np.float32) for k, v in weights.items()})


def centered_form(network, users, layer):
    """x -> (x - mean) * rsqrt(var + eps), or / sqrt(var + eps) -> y   =>   x -> Normalization(scale 1, bias 0) -> y"""
    op = layer.params["op"]
    orders = _orders(layer) if op == "prod" else [layer.inputs] if op == "div" else []
    for d, r in orders:
        centered = _centered(d)
        root = op == "div" and produced_by(r, "Unary", "sqrt")
        stats = centered and (_statistics(root.inputs[0], [root]) if root else op == "prod" and _inverse_std(r))
        if stats and stats[0] is centered[0] and stats[1] is centered[1]:
            return _fused(stats[0], stats[2], [*stats[3], centered[2], layer], network, users)
    return None


def _gamma(m: Tensor, channels: int) -> Tuple[Optional[np.ndarray], Tensor, List[Layer]]:
    """(gamma, r, layers) when `m` = gamma * r with a constant gamma along the last axis, else (None, m, [])."""
    p = produced_by(m, "ElementWise", "prod")
    for c, r in _orders(p) if p else ():
        gamma = constant_value(c)
        gamma = None if gamma is None else channel_vector(gamma, m.rank, channels)
        if gamma is not None:
            return gamma, r, [p]
    return None, m, []


def _offset(t: Tensor, mean: Tensor, m: Tensor, channels: int) -> Optional[Tuple[Optional[np.ndarray], List[Layer]]]:
    """(beta or None, layers) when `t` = beta - mean * m (also beta + (-mean) * m, or -mean * m: no beta)."""
    p, beta, sign, layers = t.producer, None, 1.0, []
    if p is not None and p.kind == "ElementWise" and p.params["op"] in ("sum", "sub"):
        for i, c in enumerate(p.inputs):
            value = constant_value(c)
            vector = None if value is None else channel_vector(value, t.rank, channels)
            if vector is not None:
                (sign, beta), t, layers = AFFINE_OPS[p.params["op"], i](vector), p.inputs[1 - i], [p]
                break
    prod = produced_by(t, "ElementWise", "prod")
    for a, b in _orders(prod) if prod else ():
        neg = produced_by(a, "Unary", "neg")
        if b is m and (a is mean and sign == -1 or neg and neg.inputs[0] is mean and sign == 1):
            return beta, ([neg] if neg else []) + [prod] + layers
    return None


def batch_norm_form(network, users, layer):
    """x -> x * m + (beta - mean * m), m = gamma * rsqrt(var + eps) -> y   =>   x -> Normalization(gamma, beta) -> y"""
    if layer.params["op"] != "sum":
        return None
    for xm, rest in _orders(layer):
        prod = produced_by(xm, "ElementWise", "prod")
        for x, m in _orders(prod) if prod else ():
            channels = x.shape[-1] if x.rank else 0
            gamma, r, gamma_layers = _gamma(m, channels)
            stats = _inverse_std(r)
            offset = stats and stats[0] is x and _offset(rest, stats[1].outputs[0], m, channels)
            if offset:
                layers = [*stats[3], *gamma_layers, *offset[1], prod, layer]
                return _fused(x, stats[2], layers, network, users, gamma, offset[0])
    return None


def residual_sum(network, users, layer):
    """ElementWise sum(a, b) -> Normalization(x) -> y   =>   Normalization(a, residual b) -> y"""
    x = layer.inputs[0]
    add = len(layer.inputs) == 1 and sole_producer(network, users, x, ("ElementWise",))
    if not add or add.params["op"] != "sum" or any(t.shape != x.shape or t.dtype != x.dtype for t in add.inputs):
        return None
    return Fused("Normalization + residual sum", [add, layer], "Normalization", add.inputs, layer.params,
                 layer.weights)


def fold_affine(network, users, layer):
    """Normalization -> per-channel Scale or ElementWise (x * s + t) -> y   =>   Normalization(scale * s,
    bias * s + t) -> y"""
    found = affine(layer)
    norm = found and sole_producer(network, users, found[0], ("Normalization",))
    if not norm:
        return None
    _, s, t = found
    scale, bias = (norm.weights[k].astype(np.float64) for k in ("scale", "bias"))
    return Fused("Normalization + Scale", [norm, layer], "Normalization", norm.inputs, norm.params,
                 {"scale": (scale * s).astype(np.float32), "bias": (bias * s + t).astype(np.float32)})


def fuse_layer_norms(network) -> bool:
    """LayerNorm subgraphs as Normalization layers, with the residual sum before and affines after them."""
    rules = {"ElementWise": [centered_form, batch_norm_form, fold_affine], "Scale": [fold_affine],
             "Normalization": [residual_sum]}
    return apply_rules(network, rules, logger)
