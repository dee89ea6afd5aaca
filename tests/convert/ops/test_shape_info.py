"""Shape, ShapeN, Size and Rank are constants while building, so int32 and int64 shape arithmetic folds and
Reshape takes a target computed from tf.shape(x); int32 math the engine cannot do exactly stays native."""
import numpy as np
import pytest
import tensorflow as tf

from reasons import check, native_ops, segmentation
from support import assert_converts, random_array, segment_graph_def
from tftrt_py.convert.build import build_engine

SHAPE_FNS = {
    "Shape": tf.shape,
    "Size": lambda t: tf.raw_ops.Size(input=t),
    "Rank": lambda t: tf.raw_ops.Rank(input=t),
    "ShapeN": lambda t: tf.raw_ops.ShapeN(input=[t, t[:1]]),
    "Size reshaped": lambda t: tf.reshape(tf.raw_ops.Size(input=t), [1]),
}


@pytest.mark.parametrize("op", sorted(SHAPE_FNS))
@pytest.mark.parametrize("dtype", ["float32", "int32", "bool"])
@pytest.mark.parametrize("shape", [(1, 3, 4), (5, 2)])
def test_shape_ops_are_build_time_constants(op, dtype, shape):
    engine = assert_converts(SHAPE_FNS[op], [random_array(shape, dtype)])
    pin = {"Slice", "Shuffle", "Select"}  # a shape output pins the engine to its batch
    assert {layer.kind for layer in engine.network.layers} <= {"Constant", "Identity"} | pin


@pytest.mark.parametrize("op", ["Shape", "Size", "ShapeN"])
def test_int64_out_type_is_a_build_time_constant_too(op):
    fns = {"Shape": lambda t: tf.shape(t, out_type=tf.int64), "Size": lambda t: tf.size(t, out_type=tf.int64),
           "ShapeN": lambda t: tf.raw_ops.ShapeN(input=[t, t[:1]], out_type=tf.int64)}
    assert_converts(fns[op], [random_array((3, 4))])


INT64_SHAPES = {  # keras-hub CLIP sizes its position ids and attention masks from an int64 tf.shape
    "Reshape": lambda t: tf.reshape(t, tf.stack([tf.shape(t, out_type=tf.int64)[0], -1])),
    "BroadcastTo": lambda t: t + tf.broadcast_to(tf.range(5, dtype=tf.float32),
                                                 tf.shape(t, out_type=tf.int64)),
    "Fill": lambda t: t * tf.fill(tf.shape(t, out_type=tf.int64), 2.0),
}


@pytest.mark.parametrize("name", sorted(INT64_SHAPES))
@pytest.mark.parametrize("batch", [1, 3])
def test_int64_shape_arithmetic_sizes_reshapes_broadcasts_and_fills(name, batch):
    fn = INT64_SHAPES[name]
    assert native_ops(fn, [tf.TensorSpec((None, 4, 5))]) == {}
    assert_converts(fn, [random_array((batch, 4, 5))])


RESHAPES = {
    "flatten by Prod": lambda t: tf.reshape(t, tf.reduce_prod(tf.shape(t), keepdims=True)),
    "batch by StridedSlice and Pack": lambda t: tf.reshape(t, [tf.shape(t)[0], -1]),
    "Mul of two dims": lambda t: tf.reshape(t, [tf.shape(t)[0] * tf.shape(t)[1], -1]),
    "Add and Sub": lambda t: tf.reshape(t, [tf.shape(t)[0] + 0, tf.shape(t)[1] - 1 + 1, -1]),
    "Size and Rank": lambda t: tf.reshape(t, [tf.size(t) // tf.shape(t)[-1] + tf.rank(t) * 0, -1]),
    "ConcatV2 of slices": lambda t: tf.reshape(t, tf.concat([tf.shape(t)[:1], [-1]], axis=0)),
}


@pytest.mark.parametrize("name", sorted(RESHAPES))
@pytest.mark.parametrize("batch", [1, 3])
def test_reshape_to_a_shape_computed_from_tf_shape(name, batch):
    """With an unknown batch nothing folds before segmenting: the whole function is one segment."""
    fn = RESHAPES[name]
    result = segmentation(fn, [tf.TensorSpec((None, 4, 5))])
    assert len(result.segments) == 1, result.report.format()
    assert native_ops(fn, [tf.TensorSpec((None, 4, 5))]) == {}
    assert_converts(fn, [random_array((batch, 4, 5))], expect_kinds=["Shuffle"])


def test_shape_from_a_native_node_is_not_known_when_building():
    """A Reshape target computed by a node that stays native (Cumsum) arrives at run time: refused."""
    fn = lambda t: tf.reshape(t, tf.cumsum(tf.shape(t)) - tf.constant([0, 3, 4]))
    reasons = native_ops(fn, [tf.TensorSpec((None, 4, 5))])
    assert any("known when building" in r for r in reasons["Reshape"]), reasons


def test_int32_matmul_and_bias_add_stay_native():
    w, b = tf.constant(np.arange(12, dtype=np.int32).reshape(3, 4)), tf.constant(np.arange(4, dtype=np.int32))
    reasons = native_ops(lambda t: tf.nn.bias_add(tf.matmul(t, w), b), [tf.TensorSpec((2, 3), tf.int32)])
    assert reasons["MatMul"] == {"MatMul with T=int32 is not supported (supported: float32, float16)": 1}
    assert reasons["BiasAdd"] == {"BiasAdd with T=int32 is not supported (supported: float32, float16)": 1}


@pytest.mark.parametrize("fn", [lambda a, b: a * b + a - b, lambda a, b: tf.maximum(a, b) * tf.minimum(a, 3)])
def test_exact_int32_arithmetic_on_tensors_converts(fn):
    assert_converts(fn, [random_array((2, 3), "int32"), random_array((3,), "int32")], expect_kinds=["ElementWise"])


@pytest.mark.parametrize("op", ["RealDiv", "Pow"])
def test_inexact_int32_arithmetic_stays_native(op):
    fn = lambda a, b: getattr(tf.raw_ops, op)(x=a, y=b)
    assert "int32" in check(fn, [tf.TensorSpec((2, 3), tf.int32)] * 2, op)


def engine_for_unknown_batch(fn, x):
    """An engine built for `x` from `fn` traced with an unknown batch (so tf.shape stays a Shape op)."""
    graph_def = segment_graph_def(fn, [tf.TensorSpec((None,) + x.shape[1:])])
    return build_engine(graph_def, [x.shape])


def test_a_batch_size_used_as_data_pins_the_engine_to_its_batch():
    """An engine built for batch 4 must not serve batch 2 when it computes with the number 4."""
    fn = lambda t: t * tf.cast(tf.shape(t)[0], tf.float32)
    x = random_array((4, 3))
    engine = engine_for_unknown_batch(fn, x)
    assert not engine.rowwise and not engine.can_serve([(2, 3)])
    (got,) = engine.create_execution_context().execute_v2([x])
    np.testing.assert_allclose(got, x * 4.0)


def test_a_batch_size_used_as_a_reshape_target_keeps_the_engine_row_wise():
    fn = lambda t: tf.nn.relu(tf.reshape(t, [tf.shape(t)[0], -1]))
    engine = engine_for_unknown_batch(fn, random_array((4, 3, 2)))
    assert engine.rowwise
    x = random_array((2, 3, 2))
    (got,) = engine.create_execution_context().execute_v2([x])
    np.testing.assert_allclose(got, np.maximum(x.reshape(2, 6), 0))
