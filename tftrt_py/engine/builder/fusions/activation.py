"""Activations: recognized in element-wise subgraphs (swish, both GELU forms, Keras's hard sigmoid and hard
swish), then fused into the Convolution, MatrixMultiply, MLP or Scale layer before them."""
from __future__ import annotations

import logging
from typing import List, Optional

import numpy as np

from tftrt_py.engine.reference import ACTIVATION_FNS, KERNELS
from tftrt_py.engine.builder.fusions.match import (BIASED, FLOATS, Fused, activation_of, affine, apply_rules,
                                                   constant_value, private, reshape_only, sole_producer,
                                                   with_activation)
from tftrt_py.engine.layer_ops import ACTIVATIONS, UNARY_OPS

__all__ = ["recognize_activations", "fuse_activations", "activation_before_reshape", "nonnegative", "FUSABLE",
           "RECOGNIZED", "NONNEGATIVE"]

logger = logging.getLogger(__name__)

_EPILOGUE = frozenset({"relu", "relu6", "clip", "leaky_relu", "elu", "sigmoid", "tanh", "gelu_erf", "gelu_tanh",
                       "swish", "hard_sigmoid", "hard_swish"})
#: layer kind -> the activation types it can apply to its own output
FUSABLE = {"Convolution": _EPILOGUE, "MatrixMultiply": _EPILOGUE, "MLP": frozenset(ACTIVATIONS),
           "Scale": frozenset(ACTIVATIONS)}

#: activations that never give a negative value (and clip with a lower bound alpha >= 0)
NONNEGATIVE = frozenset({"relu", "relu6", "sigmoid", "softplus", "hard_sigmoid"})

#: float32(1/6): Keras MobileNetV3's hard sigmoid multiplies by it (Keras's backend divides by 6)
SIXTH = float(np.float32(1 / 6))
#: activations recognized in element-wise subgraphs: one computing the same bits wins, else the first close one
RECOGNIZED = ({"type": "swish"}, {"type": "gelu_erf"}, {"type": "gelu_tanh"}, {"type": "sigmoid"},
              {"type": "softplus"}, {"type": "hard_sigmoid"}, {"type": "hard_sigmoid", "alpha": SIXTH},
              {"type": "hard_swish"}, {"type": "hard_swish", "alpha": SIXTH})
#: which layers a recognized subgraph may contain
POINTWISE = {"ElementWise": ("sum", "sub", "prod", "div", "max", "min", "pow"),
             "Unary": tuple(op for op in UNARY_OPS if op != "not"), "Activation": ACTIVATIONS}
MAX_REGION = 12
#: the points where a subgraph and an activation must agree (wide, so a clamp far out does not pass; NaN and ±Inf,
#: so NaN and Inf come out where the subgraph gives them)
PROBE = np.concatenate([np.linspace(-8, 8, 321), [-100.0, -30.0, 30.0, 100.0, np.nan, np.inf, -np.inf]]).astype(
    np.float32)
with np.errstate(all="ignore"):
    _EXPECTED = [(act, ACTIVATION_FNS[act["type"]](PROBE, act.get("alpha"), None)) for act in RECOGNIZED]


def _pointwise(layer) -> bool:
    return layer.params.get("op", layer.params.get("type")) in POINTWISE.get(layer.kind, ())


def _region(network, users, root, x) -> Optional[List]:
    """The layers computing `root` from `x` and scalar constants only, in network order, if they are
    element-wise, at most MAX_REGION, and their intermediates are read only inside."""
    found, stack = {}, [root]
    while stack:
        layer = stack.pop()
        if id(layer) in found:
            continue
        if not _pointwise(layer) or len(found) == MAX_REGION:
            return None
        found[id(layer)] = layer
        for t in layer.inputs:
            c = constant_value(t)
            if t is x or (c is not None and c.size == 1):
                continue
            if c is not None or t.producer is None:
                return None
            stack.append(t.producer)
    region = sorted(found.values(), key=network.layers.index)  # (a C scan by identity: Layer has no __eq__)
    return region if all(private(network, users, l.outputs[0], region) for l in region[:-1]) else None


def _evaluate(region, x) -> np.ndarray:
    """The region's output for x = PROBE."""
    values = {x.name: PROBE}
    with np.errstate(all="ignore"):
        for layer in region:
            args = [values[t.name] if t.name in values else constant_value(t).reshape(()) for t in layer.inputs]
            values[layer.outputs[0].name] = KERNELS[layer.kind](layer, args)[0]
    return values[region[-1].outputs[0].name]


def recognized_activation(network, users, layer):
    """x -> (a few element-wise layers on x and scalar constants) -> y   =>   Activation(x) -> y

    E.g. x * sigmoid(x) (swish), 0.5 * x * (1 + erf(x / sqrt 2)) (GELU) or its tanh form, Keras's hard swish:

        x --+--> AddV2(3) -> Relu6 -> RealDiv(6) --> Mul -> y      (hard sigmoid: without the Mul;
            +-------------------------------------->                MobileNetV3 multiplies by 1/6)

    The subgraph is evaluated on PROBE and compared with each RECOGNIZED activation.
    """
    out = layer.outputs[0]
    if out.dtype not in FLOATS or not _pointwise(layer):
        return None
    seen, queue, candidates = set(), [layer], []
    while queue and len(seen) < MAX_REGION:  # candidate inputs x: tensors upstream, nearest first
        node = queue.pop(0)
        seen.add(id(node))
        for t in node.inputs:
            if constant_value(t) is None and all(t is not c for c in candidates):
                candidates.append(t)
                if t.producer is not None and _pointwise(t.producer) and id(t.producer) not in seen:
                    queue.append(t.producer)
    for x in candidates:
        region = _region(network, users, layer, x) if x.shape == out.shape else None
        if region is None or len(region) < 2:
            continue
        y = _evaluate(region, x)
        act = next((a for a, want in _EXPECTED if np.array_equal(y, want, equal_nan=True)), None) or next(
            (a for a, want in _EXPECTED if np.allclose(y, want, rtol=1e-5, atol=1e-6, equal_nan=True)), None)
        if act is not None:
            return Fused(f"{act['type']} recognized", region, "Activation", [x], dict(act), {})
    return None


def activation_epilogue(network, users, layer):
    """Convolution/MatrixMultiply/MLP/Scale -> Activation -> y   =>   the producer applies the activation."""
    p = sole_producer(network, users, layer.inputs[0], tuple(FUSABLE))
    if p is None or activation_of(p) is not None or layer.params["type"] not in FUSABLE[p.kind]:
        return None
    return Fused(f"{p.kind} + Activation", [p, layer], p.kind, p.inputs, with_activation(p, dict(layer.params)),
                 p.weights)


def nonnegative(tensor) -> bool:
    """True when `tensor` is the output of an activation, alone or fused into its layer, that is never negative."""
    p = tensor.producer
    if p is None or p.kind not in ("Activation", *FUSABLE):
        return False
    act = (p.params if p.kind == "Activation" else activation_of(p)) or {}
    lower = act.get("alpha")
    return act.get("type") in NONNEGATIVE or (act.get("type") == "clip" and lower is not None and lower >= 0)


def recognize_activations(network) -> bool:
    """Replace element-wise subgraphs computing a known activation by one Activation layer."""
    return apply_rules(network, {"ElementWise": [recognized_activation], "Unary": [recognized_activation]}, logger)


def fuse_activations(network) -> bool:
    """Fuse each Activation into the layer producing its input, where that layer supports it."""
    return apply_rules(network, {"Activation": [activation_epilogue]}, logger)


def _before_reshape(network, users, layer) -> Optional[tuple]:
    """(Shuffle, params of `layer` moved before it) when `layer` reads a Shuffle of an output that can take it in
    its epilogue: an Activation (element-wise: it commutes with moving elements), or a bias Scale (shift only, per
    channel of the last axis, which the Shuffle must only reshape and keep) and its activation."""
    shuffle = sole_producer(network, users, layer.inputs[0], ("Shuffle",))
    if shuffle is None:
        return None
    x, act = shuffle.inputs[0], layer.params.get("type") if layer.kind == "Activation" else activation_of(layer)
    if layer.kind == "Activation":
        p, params = sole_producer(network, users, x, tuple(FUSABLE)), dict(layer.params)
    else:
        found = layer.kind == "Scale" and affine(layer, activated=True)
        if (not found or np.any(found[1] != 1) or not reshape_only(shuffle) or not x.rank
                or x.shape[-1] != shuffle.outputs[0].shape[-1]):
            return None
        p, params = sole_producer(network, users, x, BIASED), dict(layer.params, channel_axis=x.rank - 1)
        act = act and act["type"]
    if p is None or activation_of(p) is not None or (act is not None and act not in FUSABLE[p.kind]):
        return None
    return shuffle, params


def activation_before_reshape(network) -> bool:
    """x -> Shuffle -> Activation | bias Scale -> y   =>   x -> Activation | Scale -> Shuffle -> y, where x comes
    from a layer that can apply it itself (see _before_reshape): it fuses into that layer next (a dense layer's
    bias and GELU behind the reshape Keras's Tensordot adds)."""
    changed = False
    users = network.consumers()
    for layer in list(network.layers):
        if layer.kind not in ("Activation", "Scale"):
            continue
        found = _before_reshape(network, users, layer)
        if found is None:
            continue
        shuffle, params = found
        old = layer.outputs[0]
        with network.inserting_before(shuffle):
            act = network.add_layer(layer.kind, shuffle.inputs, params, dict(layer.weights), name=layer.name)
        with network.inserting_before(layer):
            moved = network.add_layer("Shuffle", act.outputs, dict(shuffle.params), name=shuffle.name)
        act.outputs[0].dynamic_range = old.dynamic_range
        network.replace_all_uses(old, moved.outputs[0])
        network.erase(layer)
        network.erase(shuffle)
        if network.is_output(moved.outputs[0]):
            moved.outputs[0].name = old.name
        logger.info("%s before reshape: %s", layer.kind, act.name)
        users = network.consumers()
        changed = True
    return changed
