"""Reshape, Squeeze, Pad/PadV2 and ConcatV2 convert with constant operands and match TensorFlow."""
import pytest
import tensorflow as tf

from support import assert_converts, frozen_graph_def, random_array
from tftrt_py.convert.context import ValidationContext
from tftrt_py.convert.graph import GraphView
from tftrt_py.convert.ops import get_converter


def check(fn, specs, op):
    """The reason the converter gives for the first `op` node of `fn` traced with `specs`."""
    view = GraphView(frozen_graph_def(fn, specs)[0])
    node = next(n for n in view.nodes.values() if n.op == op)
    return get_converter(op).check(node, ValidationContext(view))


@pytest.mark.parametrize("target", [[-1], [2, -1], [-1, 4], [6, 4], [2, 3, 2, 2], [1, 24, 1]])
@pytest.mark.parametrize("dtype", ["float32", "int32"])
def test_reshape(target, dtype):
    """A constant target shape, with at most one -1 resolved from the input's size."""
    assert_converts(lambda t: tf.reshape(t, target), [random_array((2, 3, 4), dtype)], expect_kinds=["Shuffle"])


@pytest.mark.parametrize("dims", [[], [0], [-2], [0, 2], [-4, -2]])
def test_squeeze(dims):
    """Listed dims (negative allowed), or every size-1 dim when none are listed."""
    assert_converts(lambda t: tf.squeeze(t, dims), [random_array((1, 3, 1, 4))], expect_kinds=["Shuffle"])


def test_squeeze_all_needs_known_shape():
    assert "known" in check(lambda t: tf.squeeze(t), [tf.TensorSpec((None, 1, 3))], "Squeeze")


@pytest.mark.parametrize("paddings", [[[0, 0], [1, 2], [0, 3]], [[1, 1], [0, 0], [2, 0]]])
@pytest.mark.parametrize("dtype", ["float32", "int32"])
def test_pad(paddings, dtype):
    assert_converts(lambda t: tf.raw_ops.Pad(input=t, paddings=paddings), [random_array((2, 3, 4), dtype)],
                    expect_kinds=["Padding"])


@pytest.mark.parametrize("value,dtype", [(1.5, "float32"), (-7, "int32")])
def test_pad_v2_with_a_constant_value(value, dtype):
    fn = lambda t: tf.raw_ops.PadV2(input=t, paddings=[[0, 1], [2, 1]], constant_values=tf.constant(value, dtype))
    assert_converts(fn, [random_array((3, 4), dtype)], expect_kinds=["Padding"])


@pytest.mark.parametrize("axis", [0, 1, 2, -1, -3])
@pytest.mark.parametrize("count", [2, 3, 5])
def test_concat(axis, count):
    """Any number of tensors along a constant, possibly negative, axis."""
    fn = lambda t: tf.raw_ops.ConcatV2(values=[t * float(i + 1) for i in range(count)], axis=axis)
    assert_converts(fn, [random_array((2, 3, 4))], expect_kinds=["Concatenation"])


def test_concat_two_inputs_of_different_sizes():
    assert_converts(lambda a, b: tf.concat([a, b], axis=-2), [random_array((2, 3, 4)), random_array((2, 5, 4))],
                    expect_kinds=["Concatenation"])


def test_concat_with_a_constant():
    c = random_array((2, 1, 4))
    assert_converts(lambda t: tf.concat([c, t, c], axis=-2), [random_array((2, 3, 4))],
                    expect_kinds=["Concatenation"])


def test_concat_axis_must_be_constant():
    fn = lambda a, b, axis: tf.raw_ops.ConcatV2(values=[a, b], axis=axis)
    specs = [tf.TensorSpec((2, 3)), tf.TensorSpec((2, 3)), tf.TensorSpec((), tf.int32)]
    assert "constant" in check(fn, specs, "ConcatV2")


def test_concat_of_many_inputs_keeps_binding_order():
    """Engine inputs bind in TensorRTInputPH_<i> order, whatever order the graph lists them in."""
    xs = [random_array((2, 3)) for _ in range(4)]
    assert_converts(lambda *ts: tf.concat(ts, 0), xs, expect_kinds=["Concatenation"])
