"""Fill (dims known when building, constant or tensor value), Range (all operands known), ZerosLike and OnesLike
match TF."""
import numpy as np
import pytest
import tensorflow as tf

from reasons import check, native_ops
from support import assert_converts, random_array, run_engine


@pytest.mark.parametrize("dtype", ["float32", "int32", "bool"])
@pytest.mark.parametrize("batch", [1, 4])
def test_fill_with_a_tensor_value_and_shape_of_the_input(dtype, batch):
    fn = lambda x, v: tf.fill(tf.shape(x), v)
    assert_converts(fn, [random_array((batch, 3), dtype), random_array((), dtype)])


@pytest.mark.parametrize("batch", [1, 4])
def test_fill_with_a_constant_value_plus_a_tensor(batch):
    fn = lambda x: x + tf.fill(tf.shape(x)[1:], 0.5)
    assert_converts(fn, [random_array((batch, 3, 2))], expect_kinds=["ElementWise"])


def test_fill_with_run_time_dims_is_refused():
    reason = check(lambda d: tf.fill(d, 1.0), [tf.TensorSpec((2,), tf.int32)], "Fill")
    assert "known when building" in reason


RANGES = [(0, 10, 1), (2, 11, 3), (10, -5, -4), (5, 5, 1)]


@pytest.mark.parametrize("start,limit,delta", RANGES)
def test_int_range_of_a_shape(start, limit, delta):
    """A Range over dims of the input (unknown before building) added to the input."""
    def fn(x):
        n = tf.shape(x)[0]
        r = tf.range(start * n, limit * n, delta * n)
        return tf.reshape(tf.cast(r, tf.float32), [1, -1]) + tf.reduce_sum(x)

    assert_converts(fn, [random_array((1, 2))])


@pytest.mark.parametrize("start,limit,delta", [(0.1, 100.0, 0.3), (-1.0, 1.0, 0.25), (3.0, -2.0, -0.7)])
def test_float_range_matches_tf(start, limit, delta):
    """Sizes rounded as TF rounds them, values start + i * delta in float32."""
    assert_converts(lambda x: x * tf.range(start, limit, delta), [random_array((2, 1))], rtol=1e-6, atol=0)


def test_range_over_run_time_values_stays_native():
    fn = lambda x, n: x[:1] + tf.cast(tf.range(n), tf.float32)
    reasons = native_ops(fn, [tf.TensorSpec((3,)), tf.TensorSpec((), tf.int32)])
    assert any("known when building" in r for r in reasons["Range"]), reasons


def test_range_values():
    """The numbers themselves, as an int32 engine output."""
    _, (got,) = run_engine(lambda x: tf.range(tf.shape(x)[0], 3 * tf.shape(x)[0] + 1, 2), [random_array((4, 2))])
    np.testing.assert_array_equal(got, np.arange(4, 13, 2, dtype=np.int32))



@pytest.mark.parametrize("op", ["ZerosLike", "OnesLike"])
@pytest.mark.parametrize("dtype", ["float32", "float16", "int32", "bool"])
def test_zeros_and_ones_like(op, dtype):
    """As an engine output and feeding a layer with the input."""
    like = lambda x: getattr(tf.raw_ops, op)(x=x)
    combine = tf.logical_or if dtype == "bool" else tf.add
    assert_converts(lambda x: (like(x), combine(like(x), x)), [random_array((2, 3), dtype)], rtol=0, atol=0)


def test_ones_like_is_rows_of_the_batch():
    """The constant repeats one row along the input's batch: an engine built for 3 rows serves 2."""
    engine = assert_converts(lambda x: tf.raw_ops.OnesLike(x=x) * 2.0 + x, [random_array((3, 4))])
    x = random_array((2, 4))
    assert engine.can_serve([x.shape])
    np.testing.assert_array_equal(engine.create_execution_context().execute_v2([x])[0], x + 2.0)


def test_zeros_like_of_a_shape_is_known_when_building():
    """ZerosLike(tf.shape(x)) + shape arithmetic feeding a Reshape stays inside the engine."""
    fn = lambda x: tf.reshape(x, tf.raw_ops.ZerosLike(x=tf.shape(x)) + tf.shape(x))
    assert native_ops(fn, [tf.TensorSpec((None, 3))]) == {}
    assert_converts(fn, [random_array((2, 3))])


def test_zeros_like_of_float64_is_refused():
    assert "float64" in check(lambda x: tf.raw_ops.ZerosLike(x=x), [tf.TensorSpec((2,), tf.float64)], "ZerosLike")
