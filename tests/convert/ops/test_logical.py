"""Comparisons and logical ops give bool results, broadcast like TensorFlow and match it."""
import numpy as np
import pytest
import tensorflow as tf

from reasons import check
from support import RNG, assert_converts, random_array
from tftrt_py.convert.ops.logical import COMPARISONS, EQUALITY

SHAPES = [((2, 3, 4), (2, 3, 4)), ((2, 3, 4), (4,)), ((1, 3, 1), (2, 1, 4)), ((1, 4), ())]


def few_values(shape, dtype):
    """Values from a small set (no zeros), so equal operands are common and every comparison sees both outcomes."""
    return RNG.choice(np.array([-1.5, 0.5, 2.0, 3.0]), size=shape).astype(dtype)


@pytest.mark.parametrize("op", sorted(COMPARISONS))
@pytest.mark.parametrize("shapes", SHAPES)
@pytest.mark.parametrize("dtype", ["float32", "int32", "int64"])
def test_comparison(op, shapes, dtype):
    a, b = (few_values(s, dtype) for s in shapes)
    assert_converts(lambda x, y: getattr(tf.raw_ops, op)(x=x, y=y), [a, b], expect_kinds=["ElementWise"])


@pytest.mark.parametrize("op", EQUALITY)
def test_equality_of_bools(op):
    a, b = random_array((3, 4), "bool"), random_array((4,), "bool")
    assert_converts(lambda x, y: getattr(tf.raw_ops, op)(x=x, y=y), [a, b], expect_kinds=["ElementWise"])


def test_python_equality_operator_broadcasts():
    """`a == b` emits Equal with incompatible_shape_error=False: fine when the shapes broadcast."""
    assert_converts(lambda x: x == tf.constant(2), [few_values((2, 3), "int32")], expect_kinds=["ElementWise"])


def test_equality_that_may_not_broadcast_is_refused():
    fn = lambda x, y: tf.raw_ops.Equal(x=x, y=y, incompatible_shape_error=False)
    assert "broadcast" in check(fn, [tf.TensorSpec((2, 3)), tf.TensorSpec((4,))], "Equal")


@pytest.mark.parametrize("op", ["LogicalAnd", "LogicalOr"])
@pytest.mark.parametrize("shapes", SHAPES)
def test_logical_binary(op, shapes):
    a, b = (random_array(s, "bool") for s in shapes)
    assert_converts(lambda x, y: getattr(tf.raw_ops, op)(x=x, y=y), [a, b], expect_kinds=["ElementWise"])


@pytest.mark.parametrize("shape", [(1,), (2, 3, 4)])
def test_logical_not(shape):
    assert_converts(tf.logical_not, [random_array(shape, "bool")], expect_kinds=["Unary"])


def test_comparison_feeding_logic_and_a_cast():
    fn = lambda x, y: tf.cast(tf.logical_and(x > 0.5, tf.logical_not(x < y)), tf.float32) * x
    assert_converts(fn, [random_array((2, 5)), random_array((5,))])


def test_float64_comparison_is_refused():
    assert "float64" in check(lambda x: x > 1.0, [tf.TensorSpec((2,), tf.float64)], "Greater")


def test_int64_comparison_beyond_int32():
    """int64 compares as int64: values that differ only above bit 31 stay apart."""
    a = np.array([2 ** 32 + 1, -2 ** 40, 5, 2 ** 33], np.int64)
    b = np.array([1, 0, 5 + 2 ** 32, 2 ** 33], np.int64)
    assert_converts(lambda x, y: x < y, [a, b], expect_kinds=["ElementWise"])


@pytest.mark.parametrize("shapes", SHAPES)
def test_bitwise_and(shapes):
    """Bits of both signs, float32 bits included (an NMS reads scores' bits through a Bitcast)."""
    a, b = (RNG.integers(-2 ** 31, 2 ** 31, size=s).astype("int32") for s in shapes)
    fn = lambda x, y: tf.bitwise.bitwise_and(x, y)
    assert_converts(fn, [a, b], rtol=0, atol=0, expect_kinds=["ElementWise"])
    assert_converts(lambda x: tf.bitwise.bitwise_and(tf.bitcast(x, tf.int32), -65536), [random_array(shapes[0])],
                    rtol=0, atol=0, expect_kinds=["Bitcast", "ElementWise"])


def test_int64_bitwise_and_is_refused():
    assert "int64" in check(lambda x: tf.bitwise.bitwise_and(x, x), [tf.TensorSpec((2,), tf.int64)], "BitwiseAnd")
