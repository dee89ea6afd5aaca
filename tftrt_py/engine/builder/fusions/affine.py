"""Per-channel affine layers (Scale, ElementWise with a constant): erased when they are the identity,
folded into the weights and bias of the Convolution, MatrixMultiply or MLP before them."""
from __future__ import annotations

import logging

import numpy as np

from tftrt_py.engine.builder.fusions.activation import FUSABLE
from tftrt_py.engine.builder.fusions.match import (BIASED, Bypass, Fused, activation_of, affine, apply_rules,
                                                   bias_key, constant_value, sole_producer, with_activation)

__all__ = ["erase_identities", "fold_affine", "IDENTITY_OPERANDS"]

logger = logging.getLogger(__name__)

#: (ElementWise op, index of the constant operand) -> the constant value that makes it the identity
IDENTITY_OPERANDS = {("sum", 0): 0, ("sum", 1): 0, ("sub", 1): 0, ("prod", 0): 1, ("prod", 1): 1, ("div", 1): 1,
                     ("pow", 1): 1}


def erase_scale(network, users, layer):
    """x -> Scale(scale 1, shift 0, power 1) -> y   =>   readers of y read x."""
    w = layer.weights
    if layer.params.get("activation") or any(np.any(w[k] != v) for k, v in (("scale", 1), ("shift", 0),
                                                                             ("power", 1)) if k in w):
        return None
    return Bypass("Scale erasure", [layer], layer.inputs[0])


def erase_elementwise(network, users, layer):
    """x -> ElementWise(x + 0, x - 0, x * 1, x / 1, x ** 1) -> y   =>   readers of y read x."""
    out = layer.outputs[0]
    for i, t in enumerate(layer.inputs):
        c, x = constant_value(t), layer.inputs[1 - i]
        neutral = IDENTITY_OPERANDS.get((layer.params["op"], i))
        if c is not None and neutral is not None and np.all(c == neutral) and (x.shape, x.dtype) == (out.shape,
                                                                                                      out.dtype):
            return Bypass("ElementWise erasure", [layer], x)
    return None


def fold_into_producer(network, users, layer):
    """Convolution/MatrixMultiply/MLP -> Scale or ElementWise(per-channel constant) -> y

    The shift becomes bias; a scale (Convolution only, without residual) multiplies kernel and bias; a Scale's
    activation becomes the producer's, where it can apply it. Not when the producer has an activation, or the
    scale has a power other than 1.
    """
    found = affine(layer, activated=True)
    if found is None:
        return None
    x, scale, shift = found
    p = sole_producer(network, users, x, BIASED)
    act = layer.params.get("activation") if layer.kind == "Scale" else None
    if p is None or activation_of(p) is not None or (act and act["type"] not in FUSABLE.get(p.kind, ())):
        return None
    scaled = np.any(scale != 1)
    if scaled and (p.kind != "Convolution" or len(p.inputs) > 1):
        return None
    key = bias_key(p)
    bias = p.weights.get(key, np.zeros(x.shape[-1])).astype(np.float64) * scale + shift
    weights = {**p.weights, key: bias.astype(x.dtype)}
    if scaled:
        weights["kernel"] = (p.weights["kernel"].astype(np.float64) * scale).astype(x.dtype)
    what = "Scale" if scaled else "bias"
    return Fused(f"{p.kind} + {what}", [p, layer], p.kind, p.inputs, with_activation(p, act) if act else p.params,
                 weights)


def erase_identities(network) -> bool:
    """Erase Scale and ElementWise layers that add 0, multiply or divide by 1, or raise to the power 1."""
    return apply_rules(network, {"Scale": [erase_scale], "ElementWise": [erase_elementwise]}, logger)


def fold_affine(network) -> bool:
    """Fold per-channel biases and scales (e.g. an inference batch norm) into the layer before them."""
    return apply_rules(network, {"Scale": [fold_into_producer], "ElementWise": [fold_into_producer]}, logger)
