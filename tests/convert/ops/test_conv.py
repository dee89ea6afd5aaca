"""Conv2D and DepthwiseConv2dNative become one Convolution layer and match TensorFlow.

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

#: TF op -> filter shape for 3 input channels (Conv2D: 4 outputs; depthwise: multiplier 2)
FILTERS = {"Conv2D": (3, 2, 3, 4), "DepthwiseConv2dNative": (3, 2, 3, 2)}
EXPLICIT = [0, 0, 1, 2, 0, 3, 0, 0]  # NHWC (before, after) pairs
#: (strides, dilations) per spatial dim
STEPS = [((1, 1), (1, 1)), ((2, 3), (1, 1)), ((1, 2), (2, 3))]


def nhwc_attrs(strides, dilations, padding):
    return dict(strides=[1, *strides, 1], dilations=[1, *dilations, 1], padding=padding,
                explicit_paddings=EXPLICIT if padding == "EXPLICIT" else [], data_format="NHWC")


def nchw_attrs(attrs):
    """NHWC attributes rearranged for data_format NCHW."""
    def perm(v):
        return [v[0], v[3], v[1], v[2]]
    pads = attrs["explicit_paddings"]
    return dict(attrs, strides=perm(attrs["strides"]), dilations=perm(attrs["dilations"]), data_format="NCHW",
                explicit_paddings=pads and pads[:2] + pads[6:] + pads[2:6])


def assert_nchw_converts(op, x, attrs):
    """`op` traced for NCHW converts to what the NHWC op gives on transposed data."""
    _, (got,) = run_engine(lambda t: op(t, **nchw_attrs(attrs)), [x.transpose(0, 3, 1, 2)])
    want = np.transpose(op(tf.constant(x), **attrs), (0, 3, 1, 2))
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def check(fn, spec, op):
    """The reason the converter gives for the first `op` node of `fn` traced with `spec`."""
    view = GraphView(frozen_graph_def(fn, [spec])[0])
    node = next(n for n in view.nodes.values() if n.op == op)
    return get_converter(op).check(node, ValidationContext(view))


@pytest.mark.parametrize("op", sorted(FILTERS))
@pytest.mark.parametrize("fmt", ["NHWC", "NCHW"])
@pytest.mark.parametrize("padding", ["SAME", "VALID", "EXPLICIT"])
@pytest.mark.parametrize("strides,dilations", STEPS)
@pytest.mark.parametrize("batch", [1, 2])
def test_conv_matches_tf(op, fmt, padding, strides, dilations, batch):
    """Every layout, padding mode, stride and dilation; depthwise output channel = c * multiplier + m."""
    w = random_array(FILTERS[op])
    conv = lambda t, **a: getattr(tf.raw_ops, op)(input=t, filter=w, **a)
    x, attrs = random_array((batch, 9, 8, 3)), nhwc_attrs(strides, dilations, padding)
    if fmt == "NHWC":
        assert_converts(lambda t: conv(t, **attrs), [x], expect_kinds=["Convolution"])
    else:
        assert_nchw_converts(conv, x, attrs)


def test_grouped_conv2d():
    """A filter with a fraction of the input channels is a grouped convolution (2 groups here)."""
    x, w = random_array((2, 7, 7, 4)), random_array((3, 3, 2, 6))
    _, (got,) = run_engine(lambda t: tf.raw_ops.Conv2D(input=t, filter=w, strides=[1] * 4, padding="SAME"), [x])
    want = np.concatenate([tf.nn.conv2d(x[..., 2 * g:2 * g + 2], w[..., 3 * g:3 * g + 3], 1, "SAME")
                           for g in range(2)], axis=-1)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_conv_feeds_conv():
    """Two chained convolutions (the second on the first's output) match TensorFlow."""
    w1, w2 = random_array((3, 3, 3, 5)), random_array((1, 1, 5, 2))
    fn = lambda t: tf.nn.conv2d(tf.nn.conv2d(t, w1, 2, "SAME"), w2, 1, "VALID")
    assert_converts(fn, [random_array((2, 8, 8, 3))], expect_kinds=["Convolution"])


@pytest.mark.parametrize("op", sorted(FILTERS))
def test_channel_stride_is_refused(op):
    """Strides on the channel dimension have no engine equivalent."""
    w = random_array(FILTERS[op])
    fn = lambda t: getattr(tf.raw_ops, op)(input=t, filter=w, strides=[1, 1, 1, 2], padding="SAME")
    assert "channel" in check(fn, tf.TensorSpec((1, 6, 6, 3)), op)


def test_nonconstant_filter_is_refused():
    fn = lambda t, w: tf.nn.conv2d(t, w, 1, "SAME")
    view = GraphView(frozen_graph_def(fn, [tf.TensorSpec((1, 6, 6, 3)), tf.TensorSpec((3, 3, 3, 4))])[0])
    node = next(n for n in view.nodes.values() if n.op == "Conv2D")
    assert "constant" in get_converter("Conv2D").check(node, ValidationContext(view))
