"""Lowerings of the pointwise kinds (Constant, Identity, Bitcast, ElementWise, Select, Unary, Activation, Scale)
and of the activation table the fused kinds share, with the numpy backend's semantics."""
from __future__ import annotations

from typing import Callable, Dict, Optional

import numpy as np

from tftrt_py.engine.reference import SELU_ALPHA, SELU_SCALE
from tftrt_py.engine.backends.onnxruntime.graph import CONTRIB, Graph, compute_dtype, onnx_dtype
from tftrt_py.engine.backends.onnxruntime.registry import lowers, weight

__all__ = ["activation", "biased_activation"]


def _hard_sigmoid(g: Graph, x: str, dtype, alpha) -> str:
    """relu6(x + 3) / 6, or * alpha: TF's steps in TF's order."""
    r = g.node("Clip", [g.node("Add", [x, g.scalar(3, dtype)]), g.scalar(0, dtype), g.scalar(6, dtype)])
    return g.node("Div", [r, g.scalar(6, dtype)]) if alpha is None else g.node("Mul", [r, g.scalar(alpha, dtype)])


#: activation type -> fn(g, x, dtype, alpha, beta) -> name
ACTIVATIONS: Dict[str, Callable] = {
    "relu": lambda g, x, d, a, b: g.node("Relu", [x]),
    "relu6": lambda g, x, d, a, b: g.node("Clip", [x, g.scalar(0, d), g.scalar(6, d)]),
    "clip": lambda g, x, d, a, b: g.node("Clip", [x, g.scalar(a, d), g.scalar(b, d)]),
    "leaky_relu": lambda g, x, d, a, b: g.node("LeakyRelu", [x], alpha=float(a)),
    "elu": lambda g, x, d, a, b: g.node("Elu", [x], alpha=float(a)),
    "selu": lambda g, x, d, a, b: g.node("Selu", [x], alpha=SELU_ALPHA, gamma=SELU_SCALE),
    "sigmoid": lambda g, x, d, a, b: g.node("Sigmoid", [x]),
    "tanh": lambda g, x, d, a, b: g.node("Tanh", [x]),
    "softplus": lambda g, x, d, a, b: g.node("Softplus", [x]),
    "softsign": lambda g, x, d, a, b: g.node("Softsign", [x]),
    "gelu_erf": lambda g, x, d, a, b: g.node("Gelu", [x]),
    "gelu_tanh": lambda g, x, d, a, b: g.node("Gelu", [x], approximate="tanh"),
    "swish": lambda g, x, d, a, b: g.node("Mul", [x, g.node("Sigmoid", [x])]),
    "hard_sigmoid": lambda g, x, d, a, b: _hard_sigmoid(g, x, d, a),
    "hard_swish": lambda g, x, d, a, b: g.node("Mul", [x, _hard_sigmoid(g, x, d, a)]),
}


def activation(g: Graph, x: str, act: Optional[dict], dtype) -> str:
    """`x` through activation dict `act` (type, alpha, beta), or `x` itself when `act` is None."""
    if not act:
        return x
    return ACTIVATIONS[act["type"]](g, x, dtype, act.get("alpha"), act.get("beta"))


#: activation type -> ONNX Runtime's fused bias-add + activation (com.microsoft; the same formula in fp32: bias
#: added, then TF's GELU, erf or tanh form). A Gemm's bias then the activation cost one more pass over the output:
#: ~1 ms of BERT-base's [1024, 3072] FFN at batch 8 (2-CPU AVX2 host).
BIASED = {"gelu_tanh": "FastGelu", "gelu_erf": "BiasGelu"}


def biased_activation(g: Graph, x: str, width: int, bias: Optional[np.ndarray], act: Optional[dict], dtype) -> str:
    """`x` (last dim `width`) plus `bias` (broadcast; None: none) through activation dict `act`."""
    op = act and BIASED.get(act["type"])
    if op and bias is not None and bias.shape == (width,):
        return g.node(op, [x, g.const(bias, dtype)], domain=CONTRIB)
    if bias is not None:
        x = g.node("Add", [x, g.const(bias, dtype)])
    return activation(g, x, act, dtype)


@lowers("Constant")
def _constant(g, layer, ins):
    value = layer.weights["value"]
    return [g.node("Identity", [g.const(value, compute_dtype(value.dtype.name))])]


@lowers("Identity")
def _identity(g, layer, ins):
    return [g.node("Cast", [ins[0]], to=onnx_dtype(compute_dtype(layer.outputs[0].dtype)))]


@lowers("Bitcast")
def _bitcast(g, layer, ins):
    return [g.node("BitCast", [ins[0]], to=onnx_dtype(layer.outputs[0].dtype))]


@lowers("Select")
def _select(g, layer, ins):
    """np.where, its result cast to the output's dtype (the values may differ in dtype; ONNX Runtime has no
    Where of bools: they choose as uint8)."""
    want = compute_dtype(layer.outputs[0].dtype)
    via = "uint8" if want == "bool" else want
    a, b = (g.cast(x, compute_dtype(t.dtype), via) for x, t in zip(ins[1:], layer.inputs[1:]))
    return [g.cast(g.node("Where", [ins[0], a, b]), via, want)]


def _guarded(g: Graph, fn: Callable, a: str, b: str, dtype) -> str:
    """fn(a, b) on integers, 0 where b is 0 (numpy's result; the CPU's integer division would trap)."""
    zero = g.node("Equal", [b, g.scalar(0, dtype)])
    safe = g.node("Where", [zero, g.scalar(1, dtype), b])
    return g.node("Where", [zero, g.scalar(0, dtype), fn(a, safe)])


def _div(g, a, b, dtype):
    if np.dtype(dtype).kind == "f":
        return g.node("Div", [a, b])
    # numpy divides integers in float64 and the layer casts back (truncating toward zero)
    q = g.node("Div", [g.cast(a, dtype, "float64"), g.cast(b, dtype, "float64")])
    return g.cast(q, "float64", dtype)


def _floor_div(g, a, b, dtype):
    if np.dtype(dtype).kind == "f":
        return g.node("Floor", [g.node("Div", [a, b])])
    return _guarded(g, lambda x, y: g.node("Div", [g.node("Sub", [x, g.node("Mod", [x, y])]), y]), a, b, dtype)


def _floor_mod(g, a, b, dtype):
    if np.dtype(dtype).kind != "f":
        return _guarded(g, lambda x, y: g.node("Mod", [x, y]), a, b, dtype)
    m = g.node("Mod", [a, b], fmod=1)  # C's fmod, then numpy's sign fix-up: the result takes b's sign
    zero = g.scalar(0, dtype)
    fix = g.node("And", [g.node("Not", [g.node("Equal", [m, zero])]),
                         g.node("Xor", [g.node("Less", [m, zero]), g.node("Less", [b, zero])])])
    return g.node("Where", [fix, g.node("Add", [m, b]), m])


def _squared_difference(g, a, b, dtype):
    d = g.node("Sub", [a, b])
    return g.node("Mul", [d, d])


def _binary(op: str) -> Callable:
    return lambda g, a, b, dtype: g.node(op, [a, b])


ELEMENTWISE: Dict[str, Callable] = {
    "sum": _binary("Add"), "sub": _binary("Sub"), "prod": _binary("Mul"), "div": _div, "max": _binary("Max"),
    "min": _binary("Min"), "pow": _binary("Pow"), "floor_div": _floor_div, "floor_mod": _floor_mod,
    "squared_difference": _squared_difference, "equal": _binary("Equal"), "greater": _binary("Greater"),
    "greater_equal": _binary("GreaterOrEqual"), "less": _binary("Less"), "less_equal": _binary("LessOrEqual"),
    "not_equal": lambda g, a, b, dtype: g.node("Not", [g.node("Equal", [a, b])]),
    "and": _binary("And"), "or": _binary("Or"), "bitwise_and": _binary("BitwiseAnd"),
}


#: Arithmetic numpy does on bools (sum is or, prod is and...), computed on 0 and 1 and cast back.
BOOL_AS_INT = ("sum", "prod", "max", "min")


@lowers("ElementWise")
def _elementwise(g, layer, ins):
    op, dtype = layer.params["op"], compute_dtype(layer.inputs[0].dtype)
    if dtype == "bool" and op in BOOL_AS_INT:
        out = ELEMENTWISE[op](g, *(g.cast(x, "bool", "int32") for x in ins), "int32")
        return [g.cast(out, "int32", "bool")]
    return [ELEMENTWISE[op](g, *ins, dtype)]


_ERFC_COEFFS = (-1.26551223, 1.00002368, 0.37409196, 0.09678418, -0.18628806, 0.27886807, -1.13520398,
                1.48851587, -0.82215223, 0.17087277)


def _erfc(g: Graph, x: str, dtype) -> str:
    """erfc by the numpy backend's Chebyshev fit (Numerical Recipes' erfcc) in float64: accurate in the tail."""
    x64 = g.cast(x, dtype, "float64")
    z = g.node("Abs", [x64])
    one = g.scalar(1.0, "float64")
    t = g.node("Div", [one, g.node("Add", [one, g.node("Mul", [g.scalar(0.5, "float64"), z])])])
    poly = g.scalar(0.0, "float64")
    for c in reversed(_ERFC_COEFFS[1:]):
        poly = g.node("Mul", [t, g.node("Add", [g.scalar(c, "float64"), poly])])
    exponent = g.node("Add", [g.node("Neg", [g.node("Mul", [z, z])]), g.scalar(_ERFC_COEFFS[0], "float64")])
    tail = g.node("Mul", [t, g.node("Exp", [g.node("Add", [exponent, poly])])])
    positive = g.node("GreaterOrEqual", [x64, g.scalar(0.0, "float64")])
    out = g.node("Where", [positive, tail, g.node("Sub", [g.scalar(2.0, "float64"), tail])])
    return g.cast(out, "float64", dtype)


def _unary_op(op: str) -> Callable:
    return lambda g, x, dtype: g.node(op, [x])


UNARY: Dict[str, Callable] = {
    **{name: _unary_op(op) for name, op in (
        ("exp", "Exp"), ("log", "Log"), ("sqrt", "Sqrt"), ("recip", "Reciprocal"), ("abs", "Abs"), ("neg", "Neg"),
        ("sin", "Sin"), ("cos", "Cos"), ("tan", "Tan"), ("sinh", "Sinh"), ("cosh", "Cosh"), ("asin", "Asin"),
        ("acos", "Acos"), ("atan", "Atan"), ("asinh", "Asinh"), ("acosh", "Acosh"), ("atanh", "Atanh"),
        ("ceil", "Ceil"), ("floor", "Floor"), ("round", "Round"), ("sign", "Sign"), ("erf", "Erf"),
        ("not", "Not"))},
    "rsqrt": lambda g, x, dtype: g.node("Reciprocal", [g.node("Sqrt", [x])]),
    "square": lambda g, x, dtype: g.node("Mul", [x, x]),
    "erfc": _erfc,
}


@lowers("Unary")
def _unary(g, layer, ins):
    return [UNARY[layer.params["op"]](g, ins[0], compute_dtype(layer.inputs[0].dtype))]


@lowers("Activation")
def _activation(g, layer, ins):
    return [activation(g, ins[0], layer.params, compute_dtype(layer.inputs[0].dtype))]


@lowers("Scale")
def _scale(g, layer, ins):
    x = layer.inputs[0]
    dtype = compute_dtype(x.dtype)
    axis = layer.params.get("channel_axis", -1) % x.rank
    shape = [1] * x.rank
    shape[axis] = -1
    out = ins[0]
    for key, op in (("scale", "Mul"), ("shift", "Add"), ("power", "Pow")):
        if key in layer.weights:
            w = weight(layer, key)
            out = g.node(op, [out, g.const(w.reshape(shape if w.size > 1 else []), dtype)])
    return [activation(g, out, layer.params.get("activation"), dtype)]
