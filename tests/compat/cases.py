"""Graphs of the kinds TF-TRT's integration tests build, each with the engines TF-TRT expects of it.

A case's ``engines`` maps an engine name without its graph number (TF-TRT's tests strip it: TRTEngineOp_000_001
-> TRTEngineOp_001) to the original nodes its segment holds, Consts included; every other named node stays.
"""
import dataclasses
from typing import Callable, Dict, List, Set

import numpy as np
import tensorflow as tf

RNG = np.random.default_rng(19)


def const(shape, name):
    return tf.constant(RNG.normal(0, 0.5, shape).astype(np.float32), name=name)


@dataclasses.dataclass
class Case:
    name: str
    fn: Callable
    specs: List[tf.TensorSpec]
    engines: Dict[str, Set[str]]
    native: Set[str] = dataclasses.field(default_factory=set)  # named nodes TF-TRT leaves in the graph
    batches: tuple = (4, 2)  # build() input batch sizes

    def inputs(self, batch):
        return [RNG.normal(0, 1, [batch] + s.shape.as_list()[1:]).astype(np.float32) for s in self.specs]


def spec(*dims):
    return tf.TensorSpec([None, *dims], tf.float32)


def conv_bias_relu(x):
    y = tf.nn.conv2d(x, const([3, 3, 3, 4], "filter"), strides=1, padding="SAME", name="conv")
    y = tf.nn.bias_add(y, const([4], "bias"), name="bias_add")
    return tf.identity(tf.nn.relu(y, name="relu"), name="output_0")


def matmul_biasadd(x):
    y = tf.matmul(x, const([16, 8], "weights"), name="matmul")
    return tf.identity(tf.nn.bias_add(y, const([8], "bias"), name="bias_add"), name="output_0")


def binary_broadcast(x):
    a = tf.add(x, const([5], "c_row"), name="add")
    b = tf.multiply(a, const([4, 1], "c_col"), name="mul")
    return tf.identity(tf.subtract(b, x, name="sub"), name="output_0")


def concat(x, y):
    c = tf.concat([tf.nn.relu(x, name="relu_x"), tf.nn.relu(y, name="relu_y")], axis=1, name="concat")
    return tf.identity(tf.tanh(c, name="tanh"), name="output_0")


def reshape_transpose(x):
    r = tf.reshape(tf.nn.relu(x, name="relu"), [-1, 6, 4], name="reshape")
    t = tf.transpose(r, [0, 2, 1], name="transpose")
    return tf.identity(tf.multiply(t, const([], "scale"), name="mul"), name="output_0")


def topk(x):
    values, indices = tf.math.top_k(tf.abs(x, name="abs"), k=3, name="topk")
    return tf.identity(values, name="output_0"), tf.identity(indices, name="output_1")


def unary_chain(x):
    y = tf.sigmoid(tf.tanh(tf.abs(tf.negative(x, name="neg"), name="abs"), name="tanh"), name="sigmoid")
    return tf.identity(tf.sqrt(y, name="sqrt"), name="output_0")


def split_by_unsupported(x):
    a = tf.tanh(tf.nn.relu(tf.add(x, const([6], "c1"), name="add1"), name="relu1"), name="tanh1")
    b = tf.math.cumsum(a, axis=1, name="cumsum")  # no converter: two engines around it
    c = tf.sigmoid(tf.nn.relu(tf.multiply(b, const([6], "c2"), name="mul2"), name="relu2"), name="sigmoid2")
    return tf.identity(c, name="output_0")


def const_input_segment(x):
    """Two ops and a Const: TF-TRT counts the Const, so minimum_segment_size=3 converts it."""
    return tf.identity(tf.nn.relu(tf.add(x, const([6], "c"), name="add"), name="relu"), name="output_0")


CASES = [
    Case("conv_bias_relu", conv_bias_relu, [spec(8, 8, 3)],
         {"TRTEngineOp_000": {"filter", "conv", "bias", "bias_add", "relu"}}),
    Case("matmul_biasadd", matmul_biasadd, [spec(16)],
         {"TRTEngineOp_000": {"weights", "matmul", "bias", "bias_add"}}),
    Case("binary_broadcast", binary_broadcast, [spec(4, 5)],
         {"TRTEngineOp_000": {"c_row", "add", "c_col", "mul", "sub"}}),
    Case("concat", concat, [spec(4), spec(4)], {"TRTEngineOp_000": {"relu_x", "relu_y", "concat", "tanh"}}),
    Case("reshape_transpose", reshape_transpose, [spec(4, 6)],
         {"TRTEngineOp_000": {"relu", "reshape", "transpose", "scale", "mul"}}),
    Case("topk", topk, [spec(10)], {"TRTEngineOp_000": {"abs", "topk"}}),
    Case("unary_chain", unary_chain, [spec(7)],
         {"TRTEngineOp_000": {"neg", "abs", "tanh", "sigmoid", "sqrt"}}),
    Case("split_by_unsupported", split_by_unsupported, [spec(6)],
         {"TRTEngineOp_000": {"c1", "add1", "relu1", "tanh1"}, "TRTEngineOp_001": {"c2", "mul2", "relu2", "sigmoid2"}},
         native={"cumsum"}),
    Case("const_input_segment", const_input_segment, [spec(6)], {"TRTEngineOp_000": {"c", "add", "relu"}}),
]

BY_NAME = {c.name: c for c in CASES}
