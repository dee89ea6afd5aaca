"""Reduce fusions: norms and log-sums as one Reduce op, and a global average as a Pooling layer."""
from __future__ import annotations

import logging

from tftrt_py.engine.builder.fusions.match import FLOATS, Fused, apply_rules, sole_producer, squared

__all__ = ["fuse_reductions", "INPUT_FUSIONS", "OUTPUT_FUSIONS"]

logger = logging.getLogger(__name__)

#: (Reduce op, element-wise op on its input) -> (fused Reduce op, name)
INPUT_FUSIONS = {("sum", "abs"): ("l1", "L1Norm"), ("sum", "square"): ("sum_squares", "Sum of squares"),
                 ("log_sum", "exp"): ("log_sum_exp", "LogSumExp")}
#: (Reduce op, Unary op on its output) -> (fused Reduce op, name)
OUTPUT_FUSIONS = {("sum_squares", "sqrt"): ("l2", "L2Norm"), ("sum", "log"): ("log_sum", "LogSum")}


def _elementwise_op(layer) -> str:
    """A Unary layer's op; "square" for an ElementWise x * x or x ** 2."""
    if squared(layer) is not None:
        return "square"
    return layer.params["op"] if layer.kind == "Unary" else ""


def reduce_of_elementwise(network, users, layer):
    """x -> Unary abs | square (or x * x, x ** 2) | exp -> Reduce sum | log_sum -> y   =>   x -> Reduce l1 | ... -> y"""
    p = sole_producer(network, users, layer.inputs[0], ("Unary", "ElementWise"))
    fused = p and INPUT_FUSIONS.get((layer.params["op"], _elementwise_op(p)))
    if not fused:
        return None
    return Fused(fused[1], [p, layer], "Reduce", p.inputs[:1], {**layer.params, "op": fused[0]}, {})


def unary_of_reduce(network, users, layer):
    """x -> Reduce sum_squares | sum -> Unary sqrt | log -> y   =>   x -> Reduce l2 | log_sum -> y"""
    r = sole_producer(network, users, layer.inputs[0], ("Reduce",))
    fused = r and OUTPUT_FUSIONS.get((r.params["op"], layer.params["op"]))
    if not fused:
        return None
    return Fused(fused[1], [r, layer], "Reduce", r.inputs, {**r.params, "op": fused[0]}, {})


def average_pooling(network, users, layer):
    """x [N, H, W, C] -> Reduce mean over H, W (keep dims) -> y   =>   Pooling avg, one H x W window"""
    x, p = layer.inputs[0], layer.params
    if (p["op"] != "mean" or not p.get("keep_dims") or "first_perm" in p or x.rank != 4 or x.dtype not in FLOATS
            or sorted(a % 4 for a in p["axes"]) != [1, 2]):
        return None
    window = list(x.shape[1:3])
    params = dict(type="avg", window=window, strides=window, pre_padding=[0, 0], post_padding=[0, 0])
    return Fused("Reduce -> Pooling", [layer], "Pooling", [x], params, {}, name=f"{layer.name} (pooling)")


def fuse_reductions(network) -> bool:
    """L1Norm, sum of squares, L2Norm, LogSum and LogSumExp reductions; global average pooling."""
    rules = {"Reduce": [reduce_of_elementwise, average_pooling], "Unary": [unary_of_reduce]}
    return apply_rules(network, rules, logger)
