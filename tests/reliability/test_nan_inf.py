"""NaN and ±Inf propagate as in native TensorFlow, for every layer kind; finite inputs overflow as in TF.

Each case is a small TF function whose engine holds the layer kind named (FP32 and FP16, numpy backend;
tests/engine/onnxruntime and tests/engine/gpu rerun the cases on their backends). Inputs mix NaN, +Inf and -Inf
into fresh random values, with an all-NaN row, a row holding +Inf and -Inf (Inf - Inf) and an all-Inf row along
the last axis, and (rank 4) an all-NaN and an all--Inf 2x2 window. The engine must give NaN exactly where TF does,
±Inf exactly where TF does, and TF's finite values (FP32 within 1e-5; FP16: the same NaN and ±Inf positions, finite
wherever TF's value is finite and within fp16's range). The ``huge_`` cases (FP32 only) hold ±3e38 instead: finite
values whose sums, squares and activations overflow, placed where TF's result depends on no order of summation.
TF's result is TF's op-by-op (eager) one or its graph's (grappler rewrites x * relu6(x + 3) / 6 and batch norm so
that they overflow later): the engine must match one of them.

TF's CPU semantics these tests hold the engine to (this TF 2.21 CPU build, oneDNN on and off):
* ReLU, Maximum, Minimum, ClipByValue, reductions (max, min, sum...) propagate NaN; Cast of NaN or ±Inf to int32
  gives INT_MIN;
* MaxPool ignores NaN: a window's result is the largest of its values above float32's lowest, or lowest itself
  (an all-NaN or all--Inf window gives -3.4028235e38);
* ArgMax/ArgMin skip NaN (and values not beyond float32's lowest/highest): index of the first extreme, 0 if none;
* Softmax of a row holding NaN, or +Inf (Inf - Inf), is NaN in the whole row (oneDNN, when on, gives NaN only at
  that position and 0 elsewhere: either is accepted, see ``ALTERNATIVES``); softmax and log-softmax subtract the
  row's max first (a row of ±3e38 gives 0 and 1, not NaN);
* sums and means accumulate in float32 (a mean of 3e38s is Inf, and layer normalization of such a row NaN; a row
  whose squared differences overflow normalizes to the bias).
"""
from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from specials import finite, huge as huge_values, mismatch, poisoned
from support import run_engine
from tftrt_py.engine import layers as layer_kinds

def inf_only(shape):
    """An input spec: poisoned with ±Inf but no NaN."""
    return ("inf", shape)


def finite_only(shape):
    """An input spec: no NaN or Inf (a case whose Inf comes from overflow)."""
    return ("finite", shape)


def huge(shape):
    """An input spec: finite, with +-3e38 of one sign per first-axis index (specials.huge): overflow of sums,
    squares and activations whose result is the same in any order of summation."""
    return ("huge", shape)


def huge_mixed(shape):
    """An input spec: finite, with +-3e38 of both signs anywhere (for layers whose result depends on no order of
    summation)."""
    return ("huge_mixed", shape)


W = {name: finite(shape, i) for i, (name, shape) in enumerate([
    ("k33", (3, 3, 4, 6)), ("dw", (3, 3, 4, 1)), ("b6", (6,)),
    ("dk", (2, 2, 3, 4)), ("dense", (6, 6)), ("k68", (6, 8)), ("k85", (8, 5)), ("p43", (1, 1, 4, 3)), ("b3", (3,))])}
GAMMA, BETA, MEAN, VAR = finite((4,), 20), finite((4,), 21), finite((4,), 22), np.abs(finite((4,), 23))

def _bn(x):
    return tf.compat.v1.nn.fused_batch_norm(x, GAMMA, BETA, MEAN, VAR, epsilon=1e-3, is_training=False)[0]


def _layer_norm(x):
    mean = tf.reduce_mean(x, -1, keepdims=True)
    var = tf.reduce_mean(tf.math.squared_difference(x, mean), -1, keepdims=True)
    return (x - mean) * tf.math.rsqrt(var + 1e-3) * W["b6"] + W["b6"]


def _attention(q, k, v):
    return tf.matmul(tf.nn.softmax(tf.matmul(q, k, transpose_b=True) * 0.5), v)


def _nms(boxes, scores):
    return tf.image.combined_non_max_suppression(boxes, scores, 4, 6, 0.5, 0.1)


X4, X2, X3 = (2, 6, 6, 4), (8, 6), (2, 8, 6)
#: name -> (layer kind the engine must hold, fn, input specs: a shape (poisoned) or inf_only(shape)). Several modes
#: per kind where NaN/Inf rules differ.
CASES = {
    # Activation
    **{f"activation_{n}": ("Activation", f, [X2]) for n, f in {
        "relu": tf.nn.relu, "relu6": tf.nn.relu6, "elu": tf.nn.elu, "selu": tf.nn.selu,
        "leaky_relu": lambda x: tf.nn.leaky_relu(x, 0.2), "sigmoid": tf.sigmoid, "tanh": tf.tanh,
        "softplus": tf.nn.softplus, "softsign": tf.nn.softsign, "gelu_erf": tf.nn.gelu,
        "gelu_tanh": lambda x: tf.nn.gelu(x, approximate=True), "swish": lambda x: x * tf.sigmoid(x),
        "hard_sigmoid": lambda x: tf.nn.relu6(x + 3.0) / 6.0, "hard_swish": lambda x: x * tf.nn.relu6(x + 3.0) / 6.0,
        "clip": lambda x: tf.raw_ops.ClipByValue(t=x, clip_value_min=-0.5, clip_value_max=0.5)}.items()},
    # Unary
    **{f"unary_{n}": ("Unary", f, [X2]) for n, f in {
        "exp": tf.exp, "log": tf.math.log, "sqrt": tf.sqrt, "rsqrt": tf.math.rsqrt, "recip": tf.math.reciprocal,
        "abs": tf.abs, "neg": tf.negative, "sin": tf.sin, "cos": tf.cos, "tan": tf.tan, "sinh": tf.sinh,
        "cosh": tf.cosh, "asin": tf.asin, "acos": tf.acos, "atan": tf.atan, "asinh": tf.asinh, "acosh": tf.acosh,
        "atanh": tf.atanh, "ceil": tf.math.ceil, "floor": tf.floor, "round": tf.round, "sign": tf.sign,
        "erf": tf.math.erf, "erfc": tf.math.erfc, "square": tf.square}.items()},
    "unary_not": ("Unary", lambda x: tf.cast(tf.logical_not(x > 0.0), tf.float32), [X2]),
    # ElementWise (both operands poisoned)
    **{f"elementwise_{n}": ("ElementWise", f, [X2, X2]) for n, f in {
        "sum": tf.add, "sub": tf.subtract, "prod": tf.multiply, "div": tf.divide, "max": tf.maximum,
        "min": tf.minimum, "pow": tf.pow, "floor_div": tf.math.floordiv, "floor_mod": tf.math.floormod,
        "squared_difference": tf.math.squared_difference, "and": lambda x, y: tf.cast((x > 0) & (y > 0), tf.float32),
        "or": lambda x, y: tf.cast((x > 0) | (y > 0), tf.float32),
        **{c: (lambda op: lambda x, y: tf.cast(op(x, y), tf.float32))(op) for c, op in {
            "equal": tf.equal, "not_equal": tf.not_equal, "greater": tf.greater, "greater_equal": tf.greater_equal,
            "less": tf.less, "less_equal": tf.less_equal}.items()}}.items()},
    "elementwise_swish_rewritten": ("ElementWise", lambda x: x - x / (1.0 + tf.exp(x)), [X2]),
    "elementwise_clip_by_value": ("ElementWise", lambda x: tf.clip_by_value(x, -0.5, 0.5), [X2]),
    "elementwise_max_scalar": ("ElementWise", lambda x: tf.maximum(x, 0.5), [X2]),
    "elementwise_min_scalar_first": ("ElementWise", lambda x: tf.minimum(0.5, x), [X2]),
    "elementwise_pow_scalar": ("ElementWise", lambda x: tf.pow(x, 2.5), [X2]),
    "elementwise_bitwise_and": ("ElementWise", lambda x: tf.bitwise.bitwise_and(
        tf.bitcast(x, tf.int32), 0x7FFFFFFF), [X2]),
    # Reduce (last axis and middle axis)
    **{f"reduce_{n}": ("Reduce", f, [X3]) for n, f in {
        "sum": lambda x: tf.reduce_sum(x, -1), "mean": lambda x: tf.reduce_mean(x, 1),
        "max": lambda x: tf.reduce_max(x, -1), "min": lambda x: tf.reduce_min(x, 1),
        "max_middle": lambda x: tf.reduce_max(x, 1), "prod": lambda x: tf.reduce_prod(x, -1),
        "l1": lambda x: tf.reduce_sum(tf.abs(x), -1), "sum_squares": lambda x: tf.reduce_sum(tf.square(x), -1),
        "l2": lambda x: tf.sqrt(tf.reduce_sum(x * x, -1)), "log_sum": lambda x: tf.math.log(tf.reduce_sum(x, -1)),
        "log_sum_exp": lambda x: tf.math.log(tf.reduce_sum(tf.exp(x), -1)),
        }.items()},
    "reduce_log_sum_exp_overflow": ("Reduce", lambda x: tf.math.log(tf.reduce_sum(tf.exp(x * 60.0), -1)),
                                    [finite_only(X3)]),
    "reduce_log_softmax": ("Reduce", tf.nn.log_softmax, [X2]),
    # ArgReduce
    "argreduce_max": ("ArgReduce", lambda x: tf.argmax(x, -1, output_type=tf.int32), [X3]),
    "argreduce_min": ("ArgReduce", lambda x: tf.argmin(x, -1, output_type=tf.int32), [X3]),
    "argreduce_max_middle": ("ArgReduce", lambda x: tf.argmax(x, 1, output_type=tf.int32), [X3]),
    # Pooling
    "pooling_max": ("Pooling", lambda x: tf.nn.max_pool2d(x, 2, 1, "VALID"), [X4]),
    "pooling_max_same": ("Pooling", lambda x: tf.nn.max_pool2d(x, 3, 2, "SAME"), [X4]),
    "pooling_max_zero_padded": ("Pooling", lambda x: tf.nn.max_pool2d(tf.pad(x, [[0, 0], [1, 1], [1, 1], [0, 0]]), 3, 2,
                                                                     "VALID"), [X4]),
    "pooling_avg": ("Pooling", lambda x: tf.nn.avg_pool2d(x, 2, 1, "SAME"), [X4]),
    "pooling_global_mean": ("Pooling", lambda x: tf.reduce_mean(x, [1, 2], keepdims=True), [X4]),
    # Softmax, TopK
    "softmax": ("Softmax", tf.nn.softmax, [X3]),
    "topk_inf": ("TopK", lambda x: tf.math.top_k(x, 3), [inf_only(X3)]),
    "topk_1_inf": ("TopK", lambda x: tf.math.top_k(x, 1), [inf_only(X3)]),
    "topk_all_inf": ("TopK", lambda x: tf.math.top_k(x, 6), [inf_only(X3)]),
    # Select, Identity (casts), Bitcast, Constant
    "select": ("Select", lambda x, y: tf.where(x > y, x, y), [X2, X2]),
    "select_nan_condition": ("Select", lambda x, y: tf.where(tf.math.equal(x, x), y, x), [X2, X2]),
    "identity_cast_int32": ("Identity", lambda x: tf.cast(x * 1e10, tf.int32), [X2]),
    "identity_cast_half": ("Identity", lambda x: tf.cast(tf.cast(x * 3e4, tf.float16), tf.float32), [X2]),
    "bitcast": ("Bitcast", lambda x: tf.bitcast(x * 2.0, tf.int32), [X2]),
    "constant": ("Constant", lambda x: tf.reshape(x, [-1]) + tf.constant(
        np.tile(np.array([np.nan, np.inf, -np.inf, 1.5], np.float32), 12)), [X2]),
    # Convolution, Deconvolution, MatrixMultiply, MLP, Scale, Normalization, Attention
    "convolution": ("Convolution", lambda x: tf.nn.conv2d(x, W["k33"], 1, "SAME"), [X4]),
    "convolution_relu": ("Convolution", lambda x: tf.nn.relu(tf.nn.bias_add(
        tf.nn.conv2d(x, W["k33"], 1, "SAME"), W["b6"])), [X4]),
    "convolution_bn_relu": ("Convolution", lambda x: tf.nn.relu(tf.nn.conv2d(x, W["k33"], 1, "SAME") * W["b6"]
                                                                + W["b6"]), [X4]),
    "convolution_depthwise": ("Convolution", lambda x: tf.nn.depthwise_conv2d(x, W["dw"], [1, 1, 1, 1], "SAME"),
                              [X4]),
    "deconvolution": ("Deconvolution", lambda x: tf.nn.conv2d_transpose(x, W["dk"], [2, 12, 12, 3], 2), [X4]),
    "matrix_multiply": ("MatrixMultiply", lambda x: tf.matmul(x, W["dense"]), [X2]),
    "matrix_multiply_two_poisoned": ("MatrixMultiply", lambda x, y: tf.matmul(x, y, transpose_b=True), [X2, X2]),
    "mlp": ("MLP", lambda x: tf.tanh(tf.matmul(tf.nn.relu(tf.matmul(x, W["k68"])), W["k85"])), [X2]),
    "scale_batch_norm": ("Scale", _bn, [X4]),
    "normalization": ("Normalization", _layer_norm, [X3]),
    "attention": ("Attention", _attention, [X3, X3, X3]),
    # data movement
    "shuffle": ("Shuffle", lambda x: tf.transpose(x, [0, 2, 1]), [X3]),
    "padding": ("Padding", lambda x: tf.pad(x, [[0, 0], [1, 2]], constant_values=np.nan), [X2]),
    "concatenation": ("Concatenation", lambda x, y: tf.concat([x, y * 2.0], -1), [X2, X2]),
    "slice": ("Slice", lambda x: x[:, 1:5:2] * 2.0, [X2]),
    "gather": ("Gather", lambda x: tf.gather(x, [3, 0, 1, 0], axis=1), [X2]),
    "resize_linear": ("Resize", lambda x: tf.image.resize(x, [9, 11], "bilinear"), [X4]),
    "resize_nearest": ("Resize", lambda x: tf.image.resize(x, [9, 11], "nearest"), [X4]),
    # a pointwise projection of the upsampled values (the builder moves it before the Resize)
    **{f"resize_{mode}_projection{suffix}": ("Resize", (lambda m: lambda x: tf.nn.bias_add(tf.nn.conv2d(
        tf.image.resize(x, [9, 11], m), W["p43"], 1, "VALID"), W["b3"]))(method), [spec(X4)])
       for mode, method in (("linear", "bilinear"), ("nearest", "nearest"))
       for suffix, spec in (("", lambda shape: shape), ("_inf", inf_only))},
    "nms": ("NMS", _nms, [(2, 10, 1, 4), (2, 10, 3)]),
    # Overflow of finite inputs (FP32 only: fp16 holds no 3e38)
    **{f"huge_activation_{n}": ("Activation", f, [huge_mixed(X2)]) for n, f in {
        "relu": tf.nn.relu, "relu6": tf.nn.relu6, "elu": tf.nn.elu, "selu": tf.nn.selu, "sigmoid": tf.sigmoid,
        "tanh": tf.tanh, "softplus": tf.nn.softplus, "softsign": tf.nn.softsign, "gelu_erf": tf.nn.gelu,
        "gelu_tanh": lambda x: tf.nn.gelu(x, approximate=True), "swish": lambda x: x * tf.sigmoid(x),
        "leaky_relu": lambda x: tf.nn.leaky_relu(x, 0.2),
        "hard_swish": lambda x: x * tf.nn.relu6(x + 3.0) / 6.0}.items()},
    "huge_unary_exp": ("Unary", tf.exp, [huge_mixed(X2)]),
    "huge_unary_square": ("Unary", tf.square, [huge_mixed(X2)]),
    **{f"huge_elementwise_{n}": ("ElementWise", f, [huge_mixed(X2), huge_mixed(X2)]) for n, f in {
        "sum": tf.add, "sub": tf.subtract, "prod": tf.multiply, "div": tf.divide,
        "squared_difference": tf.math.squared_difference}.items()},
    **{f"huge_reduce_{n}": ("Reduce", f, [huge(X3)]) for n, f in {
        "sum": lambda x: tf.reduce_sum(x, -1), "mean": lambda x: tf.reduce_mean(x, -1),
        "mean_middle": lambda x: tf.reduce_mean(x, 1), "max": lambda x: tf.reduce_max(x, -1),
        "min_middle": lambda x: tf.reduce_min(x, 1), "l2": lambda x: tf.sqrt(tf.reduce_sum(x * x, -1)),
        "sum_squares": lambda x: tf.reduce_sum(tf.square(x), -1),
        "log_sum_exp": lambda x: tf.math.log(tf.reduce_sum(tf.exp(x), -1))}.items()},
    "huge_reduce_log_softmax": ("Reduce", tf.nn.log_softmax, [huge_mixed(X2)]),
    "huge_softmax": ("Softmax", tf.nn.softmax, [huge_mixed(X3)]),
    "huge_argreduce_max": ("ArgReduce", lambda x: tf.argmax(x, -1, output_type=tf.int32), [huge_mixed(X3)]),
    "huge_pooling_max": ("Pooling", lambda x: tf.nn.max_pool2d(x, 3, 2, "SAME"), [huge_mixed(X4)]),
    "huge_pooling_avg": ("Pooling", lambda x: tf.nn.avg_pool2d(x, 2, 1, "SAME"), [huge(X4)]),
    "huge_pooling_global_mean": ("Pooling", lambda x: tf.reduce_mean(x, [1, 2], keepdims=True), [huge(X4)]),
    "huge_scale_batch_norm": ("Scale", _bn, [huge_mixed(X4)]),
    "huge_normalization": ("Normalization", _layer_norm, [huge(X3)]),
    "huge_identity_cast_int32": ("Identity", lambda x: tf.cast(x, tf.int32), [huge_mixed(X2)]),
}

#: Where oneDNN (when on) computes a case otherwise than TF's default CPU kernels: the default kernels' result,
#: from the inputs. The engine matches those; TF's own result is accepted too.
ALTERNATIVES = {
    "softmax": lambda x: _plain_softmax(x),
}


def _plain_softmax(x):
    with np.errstate(invalid="ignore", over="ignore"):
        e = np.exp(x - x.max(-1, keepdims=True))
        return e / e.sum(-1, keepdims=True)


def make_inputs(specs, seed):
    makers = {"inf": lambda shape, seed: poisoned(shape, seed, only_inf=True), "finite": finite, "huge": huge_values,
              "huge_mixed": lambda shape, seed: huge_values(shape, seed, mixed=True)}
    return [makers[s[0]](s[1], seed + i) if isinstance(s[0], str) else poisoned(s, seed + i)
            for i, s in enumerate(specs)]


def references(name, inputs):
    """TF's outputs for case `name`, each way native TF computes them: op by op (eager), as a graph (grappler's
    rewrites: the served SavedModel's way) and, where listed, ALTERNATIVES' (oneDNN's kernels differ)."""
    fn = CASES[name][1]
    tensors = [tf.constant(x) for x in inputs]
    with np.errstate(all="ignore"):
        refs = [fn(*tensors), tf.function(fn)(*tensors)]
        if name in ALTERNATIVES:
            refs.append(ALTERNATIVES[name](*inputs))
    return [[np.asarray(w) for w in tf.nest.flatten(ref)] for ref in refs]


def check(name, precision, fp32_tol=1e-5):
    """Case `name` built at `precision` gives TF's NaN, ±Inf and (FP32, within `fp32_tol`) finite values."""
    kind, fn, specs = CASES[name]
    inputs = make_inputs(specs, seed=sum(map(ord, name)))
    engine, outs = run_engine(fn, inputs, precision)
    assert kind in {layer.kind for layer in engine.network.layers}, [l.kind for l in engine.network.layers]
    want, *others = references(name, inputs)
    assert len(outs) == len(want)
    for i, (got, w) in enumerate(zip(outs, want)):
        if precision == "FP16" and w.dtype.kind != "f":
            continue
        tol, overflow_ok = (fp32_tol, False) if precision == "FP32" else (None, True)  # FP16: positions only
        why = mismatch(got, w, tol, overflow_ok)
        if why and any(mismatch(got, other[i], tol, overflow_ok) is None for other in others):
            why = None
        assert why is None, f"{name} output {i} ({precision}): {why}"


@pytest.mark.parametrize("name", sorted(CASES))
def test_fp32_nan_and_inf_as_tensorflow(name):
    check(name, "FP32")


#: Cases FP16 engines are not held to: their inputs lie beyond fp16's range.
FP32_ONLY = {name for name, (_, _, specs) in CASES.items() if any(str(s[0]).startswith("huge") for s in specs)}


@pytest.mark.parametrize("name", sorted(set(CASES) - FP32_ONLY))
def test_fp16_keeps_nan_and_inf_positions(name):
    check(name, "FP16")


def test_every_layer_kind_has_a_case():
    assert {kind for kind, _, _ in CASES.values()} == set(layer_kinds.kinds())
