"""ArgMax and ArgMin become one ArgReduce layer (int32 indices) and match TensorFlow."""
import pytest
import tensorflow as tf

from support import assert_converts, frozen_graph_def, random_array
from tftrt_py.convert.context import ValidationContext
from tftrt_py.convert.graph import GraphView
from tftrt_py.convert.ops import get_converter
from tftrt_py.convert.ops.arg import ARG_REDUCE


def check(fn, specs, op):
    """The reason the converter gives for the first `op` node of `fn` traced with `specs`."""
    view = GraphView(frozen_graph_def(fn, specs)[0])
    node = next(n for n in view.nodes.values() if n.op == op)
    return get_converter(op).check(node, ValidationContext(view))


@pytest.mark.parametrize("op", sorted(ARG_REDUCE))
@pytest.mark.parametrize("axis", [0, 1, 2, -1, -3])
@pytest.mark.parametrize("batch", [1, 3])
def test_arg_reduce(op, axis, batch):
    fn = lambda t: getattr(tf.raw_ops, op)(input=t, dimension=axis, output_type=tf.int32)
    assert_converts(fn, [random_array((batch, 4, 5))], expect_kinds=["ArgReduce"])


@pytest.mark.parametrize("op", sorted(ARG_REDUCE))
def test_int32_input(op):
    fn = lambda t: getattr(tf.raw_ops, op)(input=t, dimension=-1, output_type=tf.int32)
    assert_converts(fn, [random_array((3, 7), "int32")], expect_kinds=["ArgReduce"])


@pytest.mark.parametrize("op", sorted(ARG_REDUCE))
def test_int64_output_is_refused(op):
    """TF's default output_type is int64; ArgReduce gives int32 indices."""
    fn = lambda t: getattr(tf.raw_ops, op)(input=t, dimension=1)
    assert check(fn, [tf.TensorSpec((2, 3))], op) == f"{op} with output_type=int64 is not supported (supported: int32)"


def test_nonconstant_axis_is_refused():
    fn = lambda t, axis: tf.raw_ops.ArgMax(input=t, dimension=axis, output_type=tf.int32)
    reason = check(fn, [tf.TensorSpec((2, 3)), tf.TensorSpec((), tf.int32)], "ArgMax")
    assert reason == "input 1 of ArgMax must be a constant"
