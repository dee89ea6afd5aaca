"""Unary math ops become one Unary layer and match TensorFlow on their domains; Abs, Neg, Sign and Square
also on int32."""
import numpy as np
import pytest
import tensorflow as tf

from support import assert_converts, frozen_graph_def, random_array
from tftrt_py.convert.context import ValidationContext
from tftrt_py.convert.graph import GraphView
from tftrt_py.convert.ops import get_converter
from tftrt_py.convert.ops.unary import INT_EXACT, UNARY

#: op -> input values inside its domain
DOMAINS = {
    "Log": dict(positive=True), "Sqrt": dict(positive=True), "Rsqrt": dict(positive=True),
    "Asin": dict(high=0.9), "Acos": dict(high=0.9), "Atanh": dict(high=0.9), "Tan": dict(high=1.2),
    "Acosh": dict(positive=True),  # shifted past 1 below
}


@pytest.mark.parametrize("op", sorted(UNARY))
@pytest.mark.parametrize("shape", [(1, 7), (3, 4, 5)])
def test_unary_matches_tf(op, shape):
    x = random_array(shape, **DOMAINS.get(op, {}))
    if op == "Acosh":
        x = x + 1.0
    assert_converts(lambda t: getattr(tf.raw_ops, op)(x=t), [x], expect_kinds=["Unary"])


#: int32 values of both signs, with the extremes where Abs and Neg wrap and Square overflows
INT32_EDGES = np.array([-2 ** 31, 2 ** 31 - 1, 70000, -46341, -7, 3], np.int32)


@pytest.mark.parametrize("op", INT_EXACT)
def test_int32_matches_tf_bit_for_bit(op):
    x = np.concatenate([INT32_EDGES, random_array((6,), "int32") * -1, random_array((6,), "int32")]).reshape(3, 6)
    assert_converts(lambda t: getattr(tf.raw_ops, op)(x=t), [x], rtol=0, atol=0, expect_kinds=["Unary"])


def test_other_unary_ops_refuse_int32():
    view = GraphView(frozen_graph_def(lambda t: tf.math.reciprocal(t), [tf.TensorSpec((2, 3), tf.int32)])[0])
    node = next(n for n in view.nodes.values() if n.op == "Reciprocal")
    assert "int32" in get_converter("Reciprocal").check(node, ValidationContext(view))
