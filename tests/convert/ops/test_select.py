"""SelectV2 broadcasts its three operands; Select picks rows with a vector condition. Both match TF."""
import pytest
import tensorflow as tf

from reasons import check
from support import assert_converts, random_array

SHAPES = [((2, 3, 4), (2, 3, 4), (2, 3, 4)), ((4,), (2, 3, 4), (1, 3, 1)), ((2, 1, 1), (1, 4), (2, 3, 4)),
          ((1, 1), (1, 5), ())]


@pytest.mark.parametrize("shapes", SHAPES)
@pytest.mark.parametrize("dtype", ["float32", "int32", "bool"])
def test_select_v2_broadcasts(shapes, dtype):
    cond, a, b = random_array(shapes[0], "bool"), random_array(shapes[1], dtype), random_array(shapes[2], dtype)
    assert_converts(lambda c, x, y: tf.raw_ops.SelectV2(condition=c, t=x, e=y), [cond, a, b],
                    expect_kinds=["Select"])


@pytest.mark.parametrize("cond_shape", [(3,), (3, 4, 2)])
@pytest.mark.parametrize("batch", [1, 3])
def test_select_by_rows_or_elements(cond_shape, batch):
    cond_shape = (batch,) + cond_shape[1:]
    cond, a, b = random_array(cond_shape, "bool"), random_array((batch, 4, 2)), random_array((batch, 4, 2))
    assert_converts(lambda c, x, y: tf.raw_ops.Select(condition=c, x=x, y=y), [cond, a, b], expect_kinds=["Select"])


def test_where_of_a_comparison():
    """Keras Embedding's index wrap: where(ids < 0, ids + n, ids) on int32."""
    fn = lambda ids: tf.where(ids < 3, ids + 100, ids)
    assert_converts(fn, [random_array((2, 7), "int32")], expect_kinds=["Select"])


def test_select_needs_known_ranks():
    fn = lambda c, x, y: tf.raw_ops.Select(condition=c, x=x, y=y)
    specs = [tf.TensorSpec(None, tf.bool), tf.TensorSpec(None), tf.TensorSpec(None)]
    assert "rank" in check(fn, specs, "Select")
