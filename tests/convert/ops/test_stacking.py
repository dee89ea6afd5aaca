"""Pack, ExpandDims, Transpose, DepthToSpace and SpaceToDepth become Shuffles (and a Concatenation for
Pack) and match TensorFlow. NCHW block ops are compared with the NHWC op on transposed data."""
import numpy as np
import pytest
import tensorflow as tf

from support import assert_converts, frozen_graph_def, random_array, run_engine
from tftrt_py.convert.context import ValidationContext
from tftrt_py.convert.graph import GraphView
from tftrt_py.convert.ops import get_converter
from tftrt_py.convert.ops.stacking import SPACE_DEPTH


def check(fn, specs, op):
    """The reason the converter gives for the first `op` node of `fn` traced with `specs`."""
    view = GraphView(frozen_graph_def(fn, specs)[0])
    node = next(n for n in view.nodes.values() if n.op == op)
    return get_converter(op).check(node, ValidationContext(view))


@pytest.mark.parametrize("axis", [0, 1, 3, -1, -4])
@pytest.mark.parametrize("count", [1, 2, 4])
@pytest.mark.parametrize("dtype", ["float32", "int32"])
def test_pack(axis, count, dtype):
    fn = lambda *ts: tf.raw_ops.Pack(values=list(ts), axis=axis)
    assert_converts(fn, [random_array((2, 3, 4), dtype) for _ in range(count)], expect_kinds=["Shuffle"])


def test_pack_with_a_constant():
    c = random_array((2, 3))
    assert_converts(lambda t: tf.stack([t, c, t * 2.0], axis=1), [random_array((2, 3))],
                    expect_kinds=["Concatenation"])


@pytest.mark.parametrize("axis", [0, 1, 3, -1, -2, -4])
@pytest.mark.parametrize("batch", [1, 2])
def test_expand_dims(axis, batch):
    fn = lambda t: tf.raw_ops.ExpandDims(input=t, axis=axis)
    assert_converts(fn, [random_array((batch, 3, 4))], expect_kinds=["Shuffle"])


def test_expand_dims_nonconstant_axis_is_refused():
    fn = lambda t, a: tf.raw_ops.ExpandDims(input=t, axis=a)
    assert check(fn, [tf.TensorSpec((2, 3)), tf.TensorSpec((), tf.int32)], "ExpandDims") == \
        "input 1 of ExpandDims must be a constant"


@pytest.mark.parametrize("perm", [[0, 1, 2], [2, 1, 0], [0, 2, 1], [1, 2, 0], [-1, 0, -2]])
@pytest.mark.parametrize("dtype", ["float32", "bool"])
def test_transpose(perm, dtype):
    fn = lambda t: tf.raw_ops.Transpose(x=t, perm=perm)
    assert_converts(fn, [random_array((2, 3, 4), dtype)], expect_kinds=["Shuffle"])


def test_transpose_nonconstant_perm_is_refused():
    fn = lambda t, p: tf.raw_ops.Transpose(x=t, perm=p)
    assert check(fn, [tf.TensorSpec((2, 3)), tf.TensorSpec((2,), tf.int32)], "Transpose") == \
        "input 1 of Transpose must be a constant"


#: TF op -> NHWC input shape for block size 2 (and 3)
BLOCK_INPUTS = {"DepthToSpace": {2: (3, 4, 12), 3: (2, 3, 18)}, "SpaceToDepth": {2: (4, 6, 3), 3: (6, 3, 2)}}


@pytest.mark.parametrize("op", sorted(SPACE_DEPTH))
@pytest.mark.parametrize("block", [2, 3])
@pytest.mark.parametrize("fmt", ["NHWC", "NCHW"])
@pytest.mark.parametrize("batch", [1, 2])
def test_space_depth(op, block, fmt, batch):
    x = random_array((batch, *BLOCK_INPUTS[op][block]))
    nhwc = lambda t: getattr(tf.raw_ops, op)(input=t, block_size=block)
    if fmt == "NHWC":
        assert_converts(nhwc, [x], expect_kinds=["Shuffle"])
        return
    nchw = lambda t: getattr(tf.raw_ops, op)(input=t, block_size=block, data_format="NCHW")
    _, (got,) = run_engine(nchw, [x.transpose(0, 3, 1, 2)])
    np.testing.assert_allclose(got, np.transpose(nhwc(tf.constant(x)), (0, 3, 1, 2)), rtol=1e-5, atol=1e-5)


def test_depth_to_space_vect_c_is_refused():
    fn = lambda t: tf.raw_ops.DepthToSpace(input=t, block_size=2, data_format="NCHW_VECT_C")
    assert check(fn, [tf.TensorSpec((1, 4, 3, 3, 4))], "DepthToSpace").startswith(
        "data_format NCHW_VECT_C is not supported")
