"""Binary element-wise ops broadcast like TensorFlow, with the constant on either side."""
import numpy as np
import pytest
import tensorflow as tf

from support import assert_converts, random_array

OPS = {"Add": tf.raw_ops.Add, "AddV2": tf.raw_ops.AddV2, "Sub": tf.raw_ops.Sub, "Mul": tf.raw_ops.Mul,
       "RealDiv": tf.raw_ops.RealDiv, "Div": tf.raw_ops.Div, "Maximum": tf.raw_ops.Maximum,
       "Minimum": tf.raw_ops.Minimum, "SquaredDifference": tf.raw_ops.SquaredDifference}


@pytest.mark.parametrize("op", sorted(OPS))
@pytest.mark.parametrize("other_shape", [(2, 3, 4), (4,), (1, 3, 1)])
def test_two_tensors_broadcast(op, other_shape):
    fn = lambda a, b: OPS[op](x=a, y=b)
    assert_converts(fn, [random_array((2, 3, 4)), random_array(other_shape)], expect_kinds=["ElementWise"])


@pytest.mark.parametrize("op", sorted(OPS))
@pytest.mark.parametrize("const_first", [False, True])
def test_constant_on_either_side(op, const_first):
    c = tf.constant(random_array((3, 1)))
    fn = (lambda a: OPS[op](x=c, y=a)) if const_first else (lambda a: OPS[op](x=a, y=c))
    assert_converts(fn, [random_array((2, 3, 4))], expect_kinds=["ElementWise"])


def test_pow_on_positive_base():
    assert_converts(lambda a, b: tf.pow(a, b), [random_array((4, 5), positive=True), random_array((5,))],
                    expect_kinds=["ElementWise"])
