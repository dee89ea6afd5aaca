"""Tile with constant or shape-derived multiples is exact (Concatenations) and matches TF."""
import pytest
import tensorflow as tf

from reasons import check
from support import assert_converts, random_array


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
