"""GatherV2 becomes one Gather layer and matches TensorFlow."""
import numpy as np
import pytest
import tensorflow as tf

from support import RNG, assert_converts, frozen_graph_def, random_array
from tftrt_py.convert.context import ValidationContext
from tftrt_py.convert.graph import GraphView
from tftrt_py.convert.ops import get_converter

SHAPE = (3, 4, 5)


def check(fn, specs, op="GatherV2"):
    """The reason the converter gives for the first `op` node of `fn` traced with `specs`."""
    view = GraphView(frozen_graph_def(fn, specs)[0])
    node = next(n for n in view.nodes.values() if n.op == op)
    return get_converter(op).check(node, ValidationContext(view))


def indices(size, shape):
    return np.asarray(RNG.integers(0, size, size=shape), "int32")


@pytest.mark.parametrize("axis", [0, 1, 2, -1, -2])
@pytest.mark.parametrize("index_shape", [(), (2,), (2, 3)])
def test_constant_indices(axis, index_shape):
    """Scalar, vector and matrix constant indices, any axis."""
    idx = indices(SHAPE[axis], index_shape)
    fn = lambda t: tf.raw_ops.GatherV2(params=t, indices=idx, axis=axis)
    assert_converts(fn, [random_array(SHAPE)], expect_kinds=["Gather"])


@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("index_shape", [(4,), (2, 2)])
def test_tensor_indices(axis, index_shape):
    fn = lambda t, i: tf.raw_ops.GatherV2(params=t, indices=i, axis=axis)
    assert_converts(fn, [random_array(SHAPE), indices(SHAPE[axis], index_shape)], expect_kinds=["Gather"])


@pytest.mark.parametrize("dtype", ["float32", "int32", "bool"])
def test_constant_params_tensor_indices(dtype):
    """An embedding lookup: a constant table, tensor indices."""
    table = random_array((10, 4), dtype)
    fn = lambda i: tf.raw_ops.GatherV2(params=table, indices=i, axis=0)
    assert_converts(fn, [indices(10, (2, 3))], expect_kinds=["Gather"])


@pytest.mark.parametrize("index_dtype", ["int32", "int64"])
@pytest.mark.parametrize("params_shape, index_shape, batch_dims",
                         [((2, 4), (2, 3), 1), ((2, 4, 5), (2, 3), 1), ((2, 4, 5), (2, 3, 2), 1),
                          ((2, 3, 4, 5), (2, 3, 6), 2)])
def test_batch_dims_gather_per_row(params_shape, index_shape, batch_dims, index_dtype):
    """batch_dims = axis (take_along_axis): each row looks up its own indices."""
    fn = lambda t, i: tf.gather(t, i, axis=batch_dims, batch_dims=batch_dims)
    idx = indices(params_shape[batch_dims], index_shape).astype(index_dtype)
    assert_converts(fn, [random_array(params_shape), idx], expect_kinds=["Gather"])


def test_batch_dims_below_the_axis_is_refused():
    fn = lambda t, i: tf.gather(t, i, axis=2, batch_dims=1)
    reason = check(fn, [tf.TensorSpec((2, 4, 5)), tf.TensorSpec((2, 3), tf.int32)])
    assert reason == "GatherV2 with batch_dims=1 is supported only along axis 1"


def test_nonconstant_axis_is_refused():
    fn = lambda t, i, a: tf.raw_ops.GatherV2(params=t, indices=i, axis=a)
    specs = [tf.TensorSpec((2, 4)), tf.TensorSpec((3,), tf.int32), tf.TensorSpec((), tf.int32)]
    assert check(fn, specs) == "input 2 of GatherV2 must be a constant"


def test_int64_tensor_indices_and_params():
    fn = lambda t, i: tf.raw_ops.GatherV2(params=t, indices=i, axis=0)
    params = RNG.integers(-2 ** 40, 2 ** 40, size=(5, 4))
    assert_converts(fn, [params, indices(5, (3,)).astype("int64")], expect_kinds=["Gather"])


def test_gather_feeds_other_layers():
    idx = np.array([2, 0], "int32")
    fn = lambda t: tf.nn.relu(tf.gather(t, idx, axis=1)) * 2.0
    assert_converts(fn, [random_array((2, 3, 4))], expect_kinds=["Gather"])
