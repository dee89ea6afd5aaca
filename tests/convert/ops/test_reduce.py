"""Sum, Mean, Max, Min and Prod become one Reduce layer and match TensorFlow."""
import pytest
import tensorflow as tf

from support import assert_converts, frozen_graph_def, random_array
from tftrt_py.convert.context import ValidationContext
from tftrt_py.convert.graph import GraphView
from tftrt_py.convert.ops import get_converter
from tftrt_py.convert.ops.reduce import REDUCE


@pytest.mark.parametrize("op", sorted(REDUCE))
@pytest.mark.parametrize("axis", [1, [-1], [0, 2], [-3, -1], [1, -3]])
@pytest.mark.parametrize("keep_dims", [False, True])
def test_reduce_matches_tf(op, axis, keep_dims):
    """Scalar or list axes, negative and mixed axes, with and without keep_dims."""
    fn = lambda t: getattr(tf.raw_ops, op)(input=t, axis=axis, keep_dims=keep_dims)
    assert_converts(fn, [random_array((2, 3, 4))], expect_kinds=["Reduce"])


@pytest.mark.parametrize("op", ["Sum", "Max", "Prod"])
def test_int32(op):
    fn = lambda t: getattr(tf.raw_ops, op)(input=t, axis=[-1], keep_dims=False)
    assert_converts(fn, [random_array((3, 4), "int32")], expect_kinds=["Reduce"])


def test_float64_is_refused():
    view = GraphView(frozen_graph_def(lambda t: tf.reduce_mean(t, -1), [tf.TensorSpec((2, 3), tf.float64)])[0])
    node = next(n for n in view.nodes.values() if n.op == "Mean")
    assert "float64" in get_converter("Mean").check(node, ValidationContext(view))


@pytest.mark.parametrize("op", sorted(REDUCE))
@pytest.mark.parametrize("axis", [[0, 1, 2, 3], [-4], [-2, 1], []])
@pytest.mark.parametrize("keep_dims", [False, True])
@pytest.mark.parametrize("batch", [1, 3])
def test_reduce_of_rank_4(op, axis, keep_dims, batch):
    """All axes (a 0-d result, or kept 4-d with keep_dims), batch-only and empty axes lists, batch 1 and > 1."""
    fn = lambda t: getattr(tf.raw_ops, op)(input=t, axis=axis, keep_dims=keep_dims)
    assert_converts(fn, [random_array((batch, 3, 2, 4), high=1.5)], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("op", sorted(REDUCE))
@pytest.mark.parametrize("keep_dims", [False, True])
def test_int32_keep_dims_and_negative_axes(op, keep_dims):
    fn = lambda t: getattr(tf.raw_ops, op)(input=t, axis=[-1, -3], keep_dims=keep_dims)
    assert_converts(fn, [random_array((2, 3, 4), "int32")], expect_kinds=["Reduce"])


@pytest.mark.parametrize("fn", [tf.reduce_mean, tf.reduce_sum, tf.reduce_max, tf.reduce_min])
def test_keras_style_reductions_with_negative_axis_and_keepdims(fn):
    assert_converts(lambda t: fn(t, axis=-1, keepdims=True), [random_array((2, 5, 6))], expect_kinds=["Reduce"])
