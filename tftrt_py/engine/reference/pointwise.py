"""Reference kernels of pointwise, reduction and softmax kinds, and the function tables backends share."""
from __future__ import annotations

import numpy as np

from tftrt_py.engine.reference.registry import kernel

__all__ = ["ACTIVATION_FNS", "UNARY_FNS", "ELEMENTWISE_FNS", "REDUCE_FNS", "SELU_ALPHA", "SELU_SCALE",
           "apply_activation", "stable_softmax"]


def _erf(x):
    """erf by Abramowitz & Stegun 7.1.26 in float64 (absolute error below 1.5e-7)."""
    z = np.abs(x.astype(np.float64))
    t = 1.0 / (1.0 + 0.3275911 * z)
    poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))))
    return (np.sign(x) * (1.0 - poly * np.exp(-z * z))).astype(x.dtype)


def _erfc(x):
    """erfc by the Chebyshev fit of Numerical Recipes' erfcc in float64 (relative error below 1.2e-7,
    so the tail keeps float32 accuracy where 1 - erf(x) would not)."""
    z = np.abs(x.astype(np.float64))
    t = 1.0 / (1.0 + 0.5 * z)
    coeffs = (-1.26551223, 1.00002368, 0.37409196, 0.09678418, -0.18628806, 0.27886807, -1.13520398,
              1.48851587, -0.82215223, 0.17087277)
    poly = np.zeros_like(t)
    for c in reversed(coeffs[1:]):
        poly = t * (c + poly)
    tail = t * np.exp(-z * z + coeffs[0] + poly)
    return np.where(x >= 0, tail, 2.0 - tail).astype(x.dtype)


def _gelu_erf(x):
    return 0.5 * x * (1.0 + _erf(x / np.sqrt(2.0).astype(x.dtype)))


def _gelu_tanh(x):
    c = np.asarray(np.sqrt(2.0 / np.pi), x.dtype)
    return 0.5 * x * (1.0 + np.tanh(c * (x + np.asarray(0.044715, x.dtype) * x ** 3)))


def _hard_sigmoid(x, alpha):
    """relu6(x + 3) / 6, or * alpha: the steps and their order are TF's, so float32 results are TF's bits."""
    r = np.minimum(np.maximum(x + np.asarray(3, x.dtype), np.asarray(0, x.dtype)), np.asarray(6, x.dtype))
    return r / np.asarray(6, x.dtype) if alpha is None else r * np.asarray(alpha, x.dtype)


def _sigmoid(x):
    return (1.0 / (1.0 + np.exp(-x))).astype(x.dtype)  # exp overflows to inf for very negative x: sigmoid is 0


SELU_ALPHA, SELU_SCALE = 1.6732632423543772, 1.0507009873554805

ACTIVATION_FNS = {
    "relu": lambda x, a, b: np.maximum(x, 0),
    "relu6": lambda x, a, b: np.clip(x, 0, 6),
    "clip": lambda x, a, b: np.clip(x, a, b),
    "leaky_relu": lambda x, a, b: np.where(x >= 0, x, x * np.asarray(a, x.dtype)),
    "elu": lambda x, a, b: np.where(x > 0, x, np.asarray(a, x.dtype) * np.expm1(np.minimum(x, 0))),
    "selu": lambda x, a, b: np.asarray(SELU_SCALE, x.dtype) * np.where(
        x > 0, x, np.asarray(SELU_ALPHA, x.dtype) * np.expm1(np.minimum(x, 0))),
    "sigmoid": lambda x, a, b: _sigmoid(x),
    "tanh": lambda x, a, b: np.tanh(x),
    "softplus": lambda x, a, b: np.logaddexp(x, np.zeros((), x.dtype)),
    "softsign": lambda x, a, b: x / (1 + np.abs(x)),
    "gelu_erf": lambda x, a, b: _gelu_erf(x),
    "gelu_tanh": lambda x, a, b: _gelu_tanh(x),
    "swish": lambda x, a, b: x * _sigmoid(x),
    "hard_sigmoid": lambda x, a, b: _hard_sigmoid(x, a),
    "hard_swish": lambda x, a, b: x * _hard_sigmoid(x, a),
}

UNARY_FNS = {
    "exp": np.exp, "log": np.log, "sqrt": np.sqrt, "rsqrt": lambda x: 1 / np.sqrt(x),
    "recip": lambda x: 1 / x, "abs": np.abs, "neg": np.negative, "sin": np.sin, "cos": np.cos,
    "tan": np.tan, "sinh": np.sinh, "cosh": np.cosh, "asin": np.arcsin, "acos": np.arccos,
    "atan": np.arctan, "asinh": np.arcsinh, "acosh": np.arccosh, "atanh": np.arctanh,
    "ceil": np.ceil, "floor": np.floor, "round": np.round, "sign": np.sign, "erf": _erf,
    "square": np.square, "not": np.logical_not, "erfc": _erfc,
}


def _floor_div(a, b):
    if np.issubdtype(a.dtype, np.integer):
        return np.floor_divide(a, b)
    return np.floor(a / b)


def _power(a, b):
    """np.power, but a float32 tensor cubed by multiplying: numpy's float32 pow runs ~50x slower than a * a * a,
    within an ulp of it (GELU's tanh form cubes BERT's FFN tensor: 12.6M values at batch 32, 558 vs 11 ms)."""
    cube = np.ndim(b) <= np.ndim(a) and np.size(b) == 1 and np.asarray(b).item() == 3
    if cube and a.dtype == np.float32:
        return a * a * a
    return np.power(a, b)


ELEMENTWISE_FNS = {
    "sum": np.add, "sub": np.subtract, "prod": np.multiply, "div": np.divide, "max": np.maximum,
    "min": np.minimum, "pow": _power, "floor_div": _floor_div, "floor_mod": np.mod,
    "squared_difference": lambda a, b: np.square(a - b), "equal": np.equal, "greater": np.greater,
    "greater_equal": np.greater_equal, "less": np.less, "less_equal": np.less_equal,
    "not_equal": np.not_equal, "and": np.logical_and, "or": np.logical_or,
    "bitwise_and": np.bitwise_and,
}

def _sum_squares(x, axis, keepdims):
    return np.sum(np.square(x), axis=axis, keepdims=keepdims)


REDUCE_FNS = {"sum": np.sum, "mean": np.mean, "max": np.max, "min": np.min, "prod": np.prod,
              "l1": lambda x, axis, keepdims: np.sum(np.abs(x), axis=axis, keepdims=keepdims),
              "sum_squares": _sum_squares,
              "l2": lambda x, axis, keepdims: np.sqrt(_sum_squares(x, axis, keepdims)),
              "log_sum": lambda x, axis, keepdims: np.log(np.sum(x, axis=axis, keepdims=keepdims)),
              "log_sum_exp": lambda x, axis, keepdims: np.log(np.sum(np.exp(x), axis=axis, keepdims=keepdims))}


def apply_activation(x, activation):
    if not activation:
        return x
    return ACTIVATION_FNS[activation["type"]](x, activation.get("alpha"), activation.get("beta"))


@kernel("ElementWise")
def _elementwise(layer, inputs):
    a, b = inputs
    return [np.asarray(ELEMENTWISE_FNS[layer.params["op"]](a, b)).astype(layer.outputs[0].dtype, copy=False)]


@kernel("Select")
def _select(layer, inputs):
    return [np.where(*inputs).astype(layer.outputs[0].dtype, copy=False)]


@kernel("Unary")
def _unary(layer, inputs):
    out = UNARY_FNS[layer.params["op"]](inputs[0])
    return [np.asarray(out).astype(layer.outputs[0].dtype, copy=False)]


@kernel("Activation")
def _activation(layer, inputs):
    out = apply_activation(inputs[0], layer.params)
    return [np.asarray(out).astype(layer.outputs[0].dtype, copy=False)]


@kernel("Scale")
def _scale(layer, inputs):
    x = inputs[0]
    axis = layer.params.get("channel_axis", -1) % x.ndim
    shape = [1] * x.ndim
    shape[axis] = -1

    def w(key):
        v = layer.weights.get(key)
        return None if v is None else v.reshape(shape if v.size > 1 else [])

    out = x
    scale, shift, power = w("scale"), w("shift"), w("power")
    if scale is not None:
        out = out * scale
    if shift is not None:
        out = out + shift
    if power is not None:
        out = out ** power
    out = apply_activation(out, layer.params.get("activation"))
    return [np.asarray(out).astype(layer.outputs[0].dtype, copy=False)]


@kernel("Reduce")
def _reduce(layer, inputs):
    x = inputs[0]
    if layer.params.get("first_perm") is not None:
        x = np.transpose(x, layer.params["first_perm"])
    axes = tuple(a % x.ndim for a in layer.params["axes"])
    out = REDUCE_FNS[layer.params["op"]](x, axis=axes, keepdims=bool(layer.params.get("keep_dims")))
    return [np.asarray(out).astype(layer.outputs[0].dtype, copy=False)]


@kernel("ArgReduce")
def _argreduce(layer, inputs):
    """TF's ArgMax/ArgMin: the first index of the extreme among values beyond the dtype's lowest (highest), NaN
    skipped; 0 where there is none (a row of NaN or -Inf)."""
    x, axis = inputs[0], layer.params["axis"]
    if layer.params["op"] == "min":
        x = np.negative(x) if x.dtype.kind == "f" else ~x  # ~x reverses integer order without overflow
    if x.dtype.kind != "f":
        return [np.argmax(x, axis=axis).astype(np.int32)]
    beyond = x > np.finfo(x.dtype).min
    found = np.argmax(np.where(beyond, x, -np.inf), axis=axis)
    return [np.where(beyond.any(axis=axis), found, 0).astype(np.int32)]


def stable_softmax(x, axis):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


@kernel("Softmax")
def _softmax(layer, inputs):
    return [stable_softmax(inputs[0], layer.params["axis"]).astype(layer.outputs[0].dtype, copy=False)]
