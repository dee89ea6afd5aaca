"""Sum, Mean, Max, Min and Prod, and All and Any over bools, become one Reduce layer and match TensorFlow."""
import numpy as np
import pytest
import tensorflow as tf

from reasons import check
from support import assert_converts, frozen_graph_def, random_array
from tftrt_py.convert.context import ValidationContext
from tftrt_py.convert.graph import GraphView
from tftrt_py.convert.ops import get_converter
from tftrt_py.convert.ops.reduce import BOOLEAN, REDUCE

NUMERIC = sorted(op for op in REDUCE if op not in BOOLEAN)


@pytest.mark.parametrize("op", NUMERIC)
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


@pytest.mark.parametrize("op", NUMERIC)
@pytest.mark.parametrize("axis", [[0, 1, 2, 3], [-4], [-2, 1], []])
@pytest.mark.parametrize("keep_dims", [False, True])
@pytest.mark.parametrize("batch", [1, 3])
def test_reduce_of_rank_4(op, axis, keep_dims, batch):
    """All axes (a 0-d result, or kept 4-d with keep_dims), batch-only and empty axes lists, batch 1 and > 1."""
    fn = lambda t: getattr(tf.raw_ops, op)(input=t, axis=axis, keep_dims=keep_dims)
    assert_converts(fn, [random_array((batch, 3, 2, 4), high=1.5)], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("op", NUMERIC)
@pytest.mark.parametrize("keep_dims", [False, True])
def test_int32_keep_dims_and_negative_axes(op, keep_dims):
    fn = lambda t: getattr(tf.raw_ops, op)(input=t, axis=[-1, -3], keep_dims=keep_dims)
    assert_converts(fn, [random_array((2, 3, 4), "int32")], expect_kinds=["Reduce"])


@pytest.mark.parametrize("fn", [tf.reduce_mean, tf.reduce_sum, tf.reduce_max, tf.reduce_min])
def test_keras_style_reductions_with_negative_axis_and_keepdims(fn):
    assert_converts(lambda t: fn(t, axis=-1, keepdims=True), [random_array((2, 5, 6))], expect_kinds=["Reduce"])


@pytest.mark.parametrize("op", BOOLEAN)
@pytest.mark.parametrize("axis", [1, [-1], [0, 2], [-3, -1], []])
@pytest.mark.parametrize("keep_dims", [False, True])
def test_all_and_any(op, axis, keep_dims):
    """Scalar, negative, several and no axes, with and without keep_dims."""
    fn = lambda t: getattr(tf.raw_ops, op)(input=t, axis=axis, keep_dims=keep_dims)
    assert_converts(fn, [random_array((2, 3, 4), "bool")])


@pytest.mark.parametrize("fn", [tf.reduce_all, tf.reduce_any])
def test_all_and_any_of_a_comparison_over_every_axis(fn):
    """Rows that are all true and all false occur: reduce_all and reduce_any differ on the mixed ones."""
    x = np.array([[1.0, 2.0, 3.0], [-1.0, -2.0, -3.0], [1.0, -2.0, 3.0]], np.float32)
    assert_converts(lambda t: (fn(t > 0, axis=-1), fn(t > 0)), [x], expect_kinds=["Reduce"])


def test_all_of_run_time_axes_is_refused():
    fn = lambda t, a: tf.reduce_all(t, axis=a)
    assert "constant" in check(fn, [tf.TensorSpec((2, 3), tf.bool), tf.TensorSpec((1,), tf.int32)], "All")
