"""MaxPool and AvgPool become one Pooling layer and match TensorFlow (padding excluded from averages).

NCHW graphs are traced with tf.raw_ops and compared with the NHWC op on transposed data
(TF's CPU kernels are NHWC).
"""
import numpy as np
import pytest
import tensorflow as tf

from support import assert_converts, frozen_graph_def, random_array, run_engine
from tftrt_py.convert.context import ValidationContext
from tftrt_py.convert.graph import GraphView
from tftrt_py.convert.ops import get_converter

OPS = {"MaxPool": lambda t, **a: tf.raw_ops.MaxPool(input=t, **a),
       "AvgPool": lambda t, **a: tf.raw_ops.AvgPool(value=t, **a)}
#: (window, strides) per spatial dim
WINDOWS = [((2, 2), (2, 2)), ((3, 2), (1, 1)), ((3, 3), (2, 3))]


def nchw(v):
    return [v[0], v[3], v[1], v[2]]


@pytest.mark.parametrize("op", sorted(OPS))
@pytest.mark.parametrize("fmt", ["NHWC", "NCHW"])
@pytest.mark.parametrize("padding", ["SAME", "VALID"])
@pytest.mark.parametrize("window,strides", WINDOWS)
@pytest.mark.parametrize("batch", [1, 3])
def test_pooling_matches_tf(op, fmt, padding, window, strides, batch):
    x = random_array((batch, 9, 8, 3))
    ksize, steps = [1, *window, 1], [1, *strides, 1]
    if fmt == "NHWC":
        fn = lambda t: OPS[op](t, ksize=ksize, strides=steps, padding=padding, data_format="NHWC")
        assert_converts(fn, [x], expect_kinds=["Pooling"])
        return
    fn = lambda t: OPS[op](t, ksize=nchw(ksize), strides=nchw(steps), padding=padding, data_format="NCHW")
    _, (got,) = run_engine(fn, [x.transpose(0, 3, 1, 2)])
    want = np.transpose(OPS[op](tf.constant(x), ksize=ksize, strides=steps, padding=padding), (0, 3, 1, 2))
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_pooling_across_channels_is_refused():
    """A window over the channel dimension (depthwise max pooling) has no engine equivalent."""
    fn = lambda t: tf.raw_ops.MaxPool(input=t, ksize=[1, 1, 1, 3], strides=[1, 1, 1, 3], padding="VALID")
    view = GraphView(frozen_graph_def(fn, [tf.TensorSpec((1, 6, 6, 3))])[0])
    node = next(n for n in view.nodes.values() if n.op == "MaxPool")
    assert "ksize" in get_converter("MaxPool").check(node, ValidationContext(view))


def test_max_pool_explicit_padding():
    """MaxPool's explicit padding never wins the max."""
    fn = lambda t: tf.raw_ops.MaxPool(input=t, ksize=[1, 3, 2, 1], strides=[1, 2, 1, 1], padding="EXPLICIT",
                                      explicit_paddings=[0, 0, 1, 2, 0, 1, 0, 0])
    assert_converts(fn, [random_array((2, 7, 6, 3))], expect_kinds=["Pooling"])


OPS_3D = {"MaxPool3D": tf.raw_ops.MaxPool3D, "AvgPool3D": tf.raw_ops.AvgPool3D}


@pytest.mark.parametrize("op", sorted(OPS_3D))
@pytest.mark.parametrize("padding", ["SAME", "VALID"])
@pytest.mark.parametrize("window,strides", [((2, 2, 2), (2, 2, 2)), ((3, 1, 2), (1, 2, 1)), ((1, 3, 3), (2, 1, 3))])
@pytest.mark.parametrize("batch", [1, 2])
def test_3d_pooling_matches_tf(op, padding, window, strides, batch):
    fn = lambda t: OPS_3D[op](input=t, ksize=[1, *window, 1], strides=[1, *strides, 1], padding=padding)
    assert_converts(fn, [random_array((batch, 5, 6, 7, 2))], expect_kinds=["Pooling"])


@pytest.mark.parametrize("op", sorted(OPS_3D))
def test_3d_pooling_ncdhw(op):
    """NCDHW goes through two Shuffles; compared with the NDHWC op on transposed data."""
    x = random_array((2, 5, 6, 4, 3))
    ksize, steps = [1, 2, 3, 2, 1], [1, 1, 2, 2, 1]
    to_first = lambda v: [v[0], v[4], *v[1:4]]
    fn = lambda t: OPS_3D[op](input=t, ksize=to_first(ksize), strides=to_first(steps), padding="SAME",
                              data_format="NCDHW")
    _, (got,) = run_engine(fn, [x.transpose(0, 4, 1, 2, 3)])
    want = np.transpose(OPS_3D[op](input=tf.constant(x), ksize=ksize, strides=steps, padding="SAME"), (0, 4, 1, 2, 3))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
