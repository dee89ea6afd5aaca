"""Tile and BroadcastTo with constant or shape-derived multiples and shapes are exact and match TF."""
import numpy as np
import pytest
import tensorflow as tf

from reasons import check
from support import assert_converts, random_array, run_engine


@pytest.mark.parametrize("multiples", [[1, 1, 1], [2, 1, 3], [1, 4, 1], [3, 2, 2]])
@pytest.mark.parametrize("dtype", ["float32", "int32", "bool"])
@pytest.mark.parametrize("batch", [1, 2])
def test_tile(multiples, dtype, batch):
    assert_converts(lambda t: tf.tile(t, multiples), [random_array((batch, 3, 2), dtype)])


def test_tile_by_a_shape():
    """Multiples from tf.shape: tile a [1, C] row to the batch of another input."""
    fn = lambda x, row: x + tf.tile(row, [tf.shape(x)[0], 1])
    assert_converts(fn, [random_array((5, 3)), random_array((1, 3))], expect_kinds=["Concatenation"])


def test_run_time_multiples_are_refused():
    reason = check(lambda t, m: tf.tile(t, m), [tf.TensorSpec((2, 3)), tf.TensorSpec((2,), tf.int32)], "Tile")
    assert "known when building" in reason


def test_zero_multiples_are_refused():
    assert ">= 1" in check(lambda t: tf.tile(t, [0, 1]), [tf.TensorSpec((2, 3))], "Tile")


BROADCASTS = [((3, 1), [3, 4]), ((4,), [2, 3, 4]), ((2, 1, 1, 5), [2, 3, 5, 5]), ((1, 1), [1, 1]),
              ((), [2, 3]), ((1, 3, 1), [2, 1, 3, 4])]


@pytest.mark.parametrize("shape,target", BROADCASTS)
@pytest.mark.parametrize("dtype", ["float32", "float16", "int32", "bool"])
def test_broadcast_to(shape, target, dtype):
    """New leading dims and size-1 dims stretched, or nothing to do; every dtype exact."""
    assert_converts(lambda t: tf.broadcast_to(t, target), [random_array(shape, dtype)], rtol=0, atol=0)


@pytest.mark.parametrize("batch", [1, 3])
def test_broadcast_to_a_shape_of_the_input(batch):
    """The attention padding mask of keras-hub models: [B, S] -> [B, 1, 1, S] -> [B, heads, S, S]."""
    def fn(x, mask):
        b, s = tf.shape(x)[0], tf.shape(x)[-1]
        return x + tf.cast(tf.broadcast_to(mask[:, None, None, :], [b, 2, s, s]), tf.float32)

    engine = assert_converts(fn, [random_array((batch, 2, 5, 5)), random_array((batch, 5), "bool")],
                             expect_kinds=["Select"])
    assert engine.rowwise  # the mask carries the batch: smaller batches are served


def test_broadcast_to_in_fp16():
    fn = lambda x, y: tf.broadcast_to(x, [2, 3, 4]) * y
    x, y = random_array((3, 1)), random_array((2, 3, 4))
    _, (got,) = run_engine(fn, [x, y], precision="FP16")
    np.testing.assert_allclose(got, np.broadcast_to(x, (2, 3, 4)) * y, rtol=1e-2, atol=1e-2)


def test_broadcast_to_of_a_constant_over_the_batch():
    """A constant stretched to tf.shape(x)[0]: the engine serves only the batch it was built for."""
    c = tf.constant(random_array((1, 4)))
    engine = assert_converts(lambda x: x * tf.broadcast_to(c, tf.shape(x)), [random_array((3, 4))])
    assert not engine.rowwise and not engine.can_serve([(2, 4)])


def test_broadcast_to_an_empty_shape_is_refused():
    fn = lambda t: tf.broadcast_to(t, [0, 4])
    assert "empty" in check(fn, [tf.TensorSpec((1, 4))], "BroadcastTo")


def test_broadcast_to_run_time_shape_is_refused():
    fn = lambda t, s: tf.broadcast_to(t, s)
    assert "known when building" in check(fn, [tf.TensorSpec((1, 4)), tf.TensorSpec((2,), tf.int32)], "BroadcastTo")
