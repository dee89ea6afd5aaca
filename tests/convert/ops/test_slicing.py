"""Slice, StridedSlice, Split, SplitV and Unpack become Slice layers (plus a Shuffle dropping axes), Roll and
XlaDynamicUpdateSlice Slices put back together by Concatenations; all match TensorFlow exactly."""
import keras
import numpy as np
import pytest
import tensorflow as tf
from tensorflow.compiler.tf2xla.python import xla

from support import assert_converts, frozen_graph_def, random_array, segment_graph_def
from tftrt_py.convert.build import build_engine
from tftrt_py.convert.context import ValidationContext
from tftrt_py.convert.graph import GraphView
from tftrt_py.convert.ops import get_converter

SHAPE = (3, 5, 6)


def check(fn, specs, op):
    """The reason the converter gives for the first `op` node of `fn` traced with `specs`."""
    view = GraphView(frozen_graph_def(fn, specs)[0])
    node = next(n for n in view.nodes.values() if n.op == op)
    return get_converter(op).check(node, ValidationContext(view))


# -- Slice --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("begin,size", [([0, 1, 2], [3, 3, 4]), ([1, 0, 0], [-1, 5, -1]), ([2, 4, 5], [1, 1, 1]),
                                        ([0, 0, 0], [-1, -1, 3])])
@pytest.mark.parametrize("dtype", ["float32", "int32", "bool"])
def test_slice(begin, size, dtype):
    fn = lambda t: tf.raw_ops.Slice(input=t, begin=begin, size=size)
    assert_converts(fn, [random_array(SHAPE, dtype)], expect_kinds=["Slice"])


def test_slice_of_everything_adds_no_layer():
    engine = assert_converts(lambda t: tf.slice(t, [0, 0, 0], [-1, -1, -1]) * 2.0, [random_array(SHAPE)])
    assert "Slice" not in {layer.kind for layer in engine.network.layers}


def test_slice_runtime_begin_is_refused():
    fn = lambda t, b: tf.raw_ops.Slice(input=t, begin=b, size=[1, 1])
    assert check(fn, [tf.TensorSpec((3, 4)), tf.TensorSpec((2,), tf.int32)], "Slice").startswith(
        "input 1 of Slice must be known when building")


@pytest.mark.parametrize("batch", [1, 3])
def test_slice_sizes_from_shapes(batch):
    """begin and size computed from shapes are known when building."""
    fn = lambda t, u: tf.slice(t, [0, tf.shape(u)[1] - 2], [-1, tf.shape(u)[1]])
    assert_converts(fn, [random_array((batch, 6)), random_array((batch, 3))], expect_kinds=["Slice"])


# -- StridedSlice -------------------------------------------------------------------------------------
#: Python subscripts (each traced into one StridedSlice)
SUBSCRIPTS = {
    "range": lambda t: t[1:3, 2:, :4],
    "negative_indices": lambda t: t[-2:, -4:-1, :-2],
    "steps": lambda t: t[::2, 1::3, ::4],
    "reverse": lambda t: t[::-1, 3:0:-1, ::-2],
    "reverse_to_start": lambda t: t[:, -1::-2, 4::-1],
    "shrink_first": lambda t: t[1],
    "shrink_last": lambda t: t[:, :, -1],
    "shrink_many": lambda t: t[0, 1:, 2],
    "scalar": lambda t: t[2, -1, 0] - t[0],  # the engine's outputs have rank >= 1
    "ellipsis": lambda t: t[..., 1:5:2],
    "ellipsis_middle": lambda t: t[1:, ..., ::-1],
    "ellipsis_shrink": lambda t: t[..., 3],
    "implicit_trailing": lambda t: t[1:2],
    "out_of_range_clamps": lambda t: t[-10:10, 2:100, -100:],
    "empty_dim": lambda t: t[:, 3:1],
    "new_axis": lambda t: t[:, tf.newaxis, 1:],
    "new_axis_first_and_last": lambda t: t[tf.newaxis, ..., tf.newaxis],
    "new_axis_with_shrink": lambda t: t[1, tf.newaxis, :, 2],
    "new_axes_after_ellipsis": lambda t: t[..., tf.newaxis, 1:4, tf.newaxis],
}


@pytest.mark.parametrize("name", sorted(SUBSCRIPTS))
@pytest.mark.parametrize("dtype", ["float32", "int32"])
def test_strided_slice_subscripts(name, dtype):
    assert_converts(SUBSCRIPTS[name], [random_array(SHAPE, dtype)])


@pytest.mark.parametrize("begin_mask,end_mask", [(0, 0), (0b101, 0), (0, 0b110), (0b111, 0b111)])
@pytest.mark.parametrize("strides", [[1, 1, 1], [1, -1, 2], [-1, 2, -2]])
def test_strided_slice_masks(begin_mask, end_mask, strides):
    """begin_mask/end_mask bits override begin/end, whatever the stride's sign."""
    fn = lambda t: tf.raw_ops.StridedSlice(input=t, begin=[1, -2, 1], end=[2, 0, 5], strides=strides,
                                           begin_mask=begin_mask, end_mask=end_mask)
    assert_converts(fn, [random_array(SHAPE)])


@pytest.mark.parametrize("batch", [1, 4])
def test_strided_slice_keeps_batch_rows(batch):
    """Slicing only non-batch axes, as models do (x[:, 1:, 0])."""
    assert_converts(lambda t: tf.nn.relu(t[:, 1:, 0]), [random_array((batch, 5, 6))], expect_kinds=["Slice"])


def test_strided_slice_new_axis_and_shrink_bits_on_one_entry_add_the_axis():
    """As TF: the new axis wins over a shrink bit on the same entry."""
    fn = lambda t: tf.raw_ops.StridedSlice(input=t, begin=[0, 0], end=[1, 2], strides=[1, 1], new_axis_mask=0b1,
                                           shrink_axis_mask=0b1)
    assert_converts(fn, [random_array(SHAPE)])


def test_strided_slice_runtime_end_is_refused():
    fn = lambda t, e: tf.raw_ops.StridedSlice(input=t, begin=[0, 0], end=e, strides=[1, 1])
    assert check(fn, [tf.TensorSpec((3, 4)), tf.TensorSpec((2,), tf.int32)], "StridedSlice").startswith(
        "input 2 of StridedSlice must be known when building")


@pytest.mark.parametrize("batch", [1, 3])
def test_strided_slice_bounds_from_shapes(batch):
    """x[:, :tf.shape(y)[1]] and the like: bounds computed from shapes are known when building."""
    fn = lambda t, u: t[:, tf.shape(t)[1] - tf.shape(u)[1]:, :tf.shape(u)[1] + 1]
    assert_converts(fn, [random_array((batch, 5, 6)), random_array((batch, 3))], expect_kinds=["Slice"])


def test_strided_slice_of_a_shape():
    """tf.shape(x)[0] folds to a constant while building (no Slice layer)."""
    engine = assert_converts(lambda t: tf.reshape(t, [tf.shape(t)[0], -1]), [random_array((2, 3, 4))])
    assert "Slice" not in {layer.kind for layer in engine.network.layers}


def test_strided_slice_needs_known_rank():
    fn = lambda t: tf.raw_ops.StridedSlice(input=t, begin=[1], end=[2], strides=[1])
    assert "known rank" in check(fn, [tf.TensorSpec(None)], "StridedSlice")


# -- Split, SplitV, Unpack ----------------------------------------------------------------------------
@pytest.mark.parametrize("axis,num", [(0, 3), (1, 5), (2, 2), (-1, 3), (-2, 1)])
def test_split(axis, num):
    fn = lambda t: tf.raw_ops.Split(axis=axis, value=t, num_split=num)
    assert_converts(fn, [random_array(SHAPE)])


@pytest.mark.parametrize("axis,sizes", [(1, [1, 4]), (2, [2, -1, 1]), (-1, [-1, 6]), (0, [1, 1, 1])])
@pytest.mark.parametrize("dtype", ["float32", "int32"])
def test_split_v(axis, sizes, dtype):
    fn = lambda t: tf.raw_ops.SplitV(value=t, size_splits=sizes, axis=axis, num_split=len(sizes))
    assert_converts(fn, [random_array(SHAPE, dtype)])


@pytest.mark.parametrize("axis", [0, 1, 2, -1, -3])
def test_unpack(axis):
    fn = lambda t: tf.raw_ops.Unpack(value=t, num=SHAPE[axis], axis=axis)
    assert_converts(fn, [random_array(SHAPE)], expect_kinds=["Slice", "Shuffle"])


def test_split_outputs_feed_other_layers():
    fn = lambda t: tf.concat([b * 2.0 for b in tf.split(t, 3, axis=-1)][::-1], axis=1)
    assert_converts(fn, [random_array((2, 4, 6))], expect_kinds=["Slice"])


def test_split_nonconstant_axis_is_refused():
    fn = lambda t, a: tf.raw_ops.Split(axis=a, value=t, num_split=2)
    assert check(fn, [tf.TensorSpec((4, 4)), tf.TensorSpec((), tf.int32)], "Split") == \
        "input 0 of Split must be a constant"


def test_split_v_nonconstant_sizes_is_refused():
    fn = lambda t, s: tf.raw_ops.SplitV(value=t, size_splits=s, axis=1, num_split=2)
    assert check(fn, [tf.TensorSpec((4, 4)), tf.TensorSpec((2,), tf.int32)], "SplitV") == \
        "input 1 of SplitV must be a constant"


@pytest.mark.parametrize("axes", [[0], [1], [-1], [0, 2], [1, 2]])
@pytest.mark.parametrize("dtype", ["float32", "int32", "int64"])
def test_reverse(axes, dtype):
    """ReverseV2 is one Slice with stride -1 on each reversed axis."""
    assert_converts(lambda t: tf.reverse(t, axes), [random_array((2, 3, 4), dtype)], expect_kinds=["Slice"])


def engine_for(fn, x):
    """An engine built for `x` from `fn` traced with an unknown batch."""
    return build_engine(segment_graph_def(fn, [tf.TensorSpec((None,) + x.shape[1:], x.dtype)]), [x.shape])


def assert_serves(engine, fn, x):
    """`engine` gives on `x` exactly what TF gives."""
    (got,) = engine.create_execution_context().execute_v2([x])
    want = np.asarray(fn(tf.constant(x)))
    assert got.shape == want.shape and got.dtype == want.dtype, (got.shape, want.shape, got.dtype, want.dtype)
    np.testing.assert_array_equal(got, want)


# -- Roll -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("shift, axis", [(1, 0), (-2, 1), (7, 2), ([1, -1], [1, 2]), ([2, 3], [-1, -1]),
                                         ([4, 5], [1, 2]), ([0], [1])])
@pytest.mark.parametrize("dtype", ["float32", "int32", "int64", "bool"])
def test_roll(shift, axis, dtype):
    """Negative shifts, shifts past the dim, an axis named twice (the shifts add), whole turns (no layer)."""
    assert_converts(lambda t: tf.roll(t, shift, axis), [random_array(SHAPE, dtype)], rtol=0, atol=0)


@pytest.mark.parametrize("batch", [4, 3, 1])
def test_roll_of_the_spatial_axes_serves_smaller_batches(batch):
    """Swin's shifted windows: rolling the token grid keeps each image apart, so the engine built for 4 serves 3
    and 1."""
    fn = lambda t: tf.roll(tf.roll(t * 2.0, (-2, -2), (1, 2)) + 1.0, (2, 2), (1, 2)) * t
    engine = engine_for(fn, random_array((4, 8, 8, 3)))
    assert engine.rowwise and engine.can_serve([(batch, 8, 8, 3)])
    assert_serves(engine, fn, random_array((batch, 8, 8, 3)))


def test_roll_along_the_batch_pins_the_engine():
    fn = lambda t: tf.roll(t, 1, 0) * 2.0
    engine = engine_for(fn, random_array((4, 5)))
    assert not engine.rowwise and not engine.can_serve([(3, 5)])
    assert_serves(engine, fn, random_array((4, 5)))


def test_roll_by_a_run_time_shift_is_refused():
    fn = lambda t, s: tf.roll(t, s, 0)
    assert check(fn, [tf.TensorSpec((3, 4)), tf.TensorSpec((), tf.int32)], "Roll").startswith(
        "input 1 of Roll must be known when building")


# -- XlaDynamicUpdateSlice ------------------------------------------------------------------------
@pytest.mark.parametrize("update_shape, indices", [((2, 2, 3), [1, 2, 3]), ((1, 5, 6), [2, 0, 0]),
                                                   ((3, 1, 6), [0, 4, 0]), ((2, 3, 2), [-1, 9, 3]),
                                                   ((3, 5, 6), [0, 0, 0])])
@pytest.mark.parametrize("dtype", ["float32", "int32", "int64", "bool"])
def test_dynamic_update_slice(update_shape, indices, dtype):
    """Indices outside the input are clamped so the update fits, as XLA does (the fourth case)."""
    update = tf.constant(random_array(update_shape, dtype))
    fn = lambda t: xla.dynamic_update_slice(t, update, indices)
    assert_converts(fn, [random_array(SHAPE, dtype)], rtol=0, atol=0)


def test_dynamic_update_slice_of_two_tensors():
    fn = lambda t, u: xla.dynamic_update_slice(t * 2.0, u + 1.0, tf.constant([1, 2], tf.int64))
    assert_converts(fn, [random_array((4, 6)), random_array((2, 3))], rtol=0, atol=0)


@pytest.mark.parametrize("batch", [4, 3, 1])
def test_dynamic_update_slice_of_whole_rows_serves_smaller_batches(batch):
    """An update spanning the batch, written at index 0 of it: the engine built for 4 serves 3 and 1."""
    fn = lambda t: xla.dynamic_update_slice(t, t[:, :2, 1:3] * 3.0, [0, 3, 0])
    engine = engine_for(fn, random_array((4, 5, 4)))
    assert engine.rowwise and engine.can_serve([(batch, 5, 4)])
    assert_serves(engine, fn, random_array((batch, 5, 4)))


def test_a_constant_mask_built_by_slice_updates_folds_into_the_engine():
    """Swin's shifted-window mask: keras.ops.slice_update writes region numbers into a zero image; every layer
    folds into one constant."""
    def fn(t):
        mask = keras.ops.zeros((1, 4, 4, 1), dtype="int32")
        for i, (h, w) in enumerate([(0, 0), (0, 2), (2, 0), (2, 2)]):
            mask = keras.ops.slice_update(mask, [0, h, w, 0], keras.ops.ones((1, 2, 2, 1), dtype="int32") * i)
        return t * tf.cast(mask, tf.float32)
    engine = assert_converts(fn, [random_array((2, 4, 4, 3))], rtol=0, atol=0)
    assert {layer.kind for layer in engine.network.layers} <= {"ElementWise", "Constant", "Scale"}


def test_dynamic_update_slice_at_run_time_indices_is_refused():
    fn = lambda t, i: xla.dynamic_update_slice(t, tf.ones((1, 2)), i)
    assert check(fn, [tf.TensorSpec((3, 4)), tf.TensorSpec((2,), tf.int32)], "XlaDynamicUpdateSlice").startswith(
        "input 2 of XlaDynamicUpdateSlice must be known when building")


def test_dynamic_update_slice_of_a_larger_update_is_refused():
    fn = lambda t: xla.dynamic_update_slice(t, tf.ones((4, 2)), [0, 0])
    assert "update of shape [4, 2] into [3, 4]" in check(fn, [tf.TensorSpec((3, 4))], "XlaDynamicUpdateSlice")
