"""Conv2DBackpropInput and Conv3DBackpropInputV2 become one Deconvolution layer and match TensorFlow.

The reference is support.reference_conv_transpose (TF's default CPU kernels reject dilations: it computes them
undilated on a filter with zeros between taps); channels-first graphs are traced with tf.raw_ops and compared
with it on transposed data (TF's CPU kernels are channels-last).
"""
import numpy as np
import pytest
import tensorflow as tf

from support import (assert_converts, frozen_graph_def, random_array, reference_conv, reference_conv_transpose,
                     run_engine)
from tftrt_py.convert.context import ValidationContext
from tftrt_py.convert.graph import GraphView
from tftrt_py.convert.ops import get_converter

EXPLICIT = [0, 0, 2, 1, 0, 2, 0, 0]  # NHWC (before, after) pairs
#: (forward input size, strides, dilations): sizes that leave rows no window reaches included
STEPS_2D = [((9, 8), (1, 1), (1, 1)), ((9, 8), (2, 3), (1, 1)), ((10, 9), (2, 2), (1, 1)),
            ((9, 8), (1, 1), (2, 3)), ((11, 7), (3, 1), (1, 2))]


def to_nchw(v):
    return [v[0], v[3], v[1], v[2]]


def deconv2d(sizes, w, strides, dilations, padding, fmt="NHWC"):
    """Conv2DBackpropInput with NHWC `sizes`/`strides`/`dilations`, rearranged for `fmt`."""
    perm = to_nchw if fmt == "NCHW" else list
    pads = EXPLICIT if padding == "EXPLICIT" else []
    if fmt == "NCHW" and pads:
        pads = pads[:2] + pads[6:] + pads[2:6]
    return lambda t: tf.raw_ops.Conv2DBackpropInput(
        input_sizes=perm(sizes), filter=w, out_backprop=t, strides=perm([1, *strides, 1]), padding=padding,
        explicit_paddings=pads, dilations=perm([1, *dilations, 1]), data_format=fmt)


def out_backprop_shape(sizes, w, strides, dilations, padding):
    """The forward convolution's output shape for channels-last input `sizes`."""
    pads = EXPLICIT if padding == "EXPLICIT" else ()
    return reference_conv(np.ones(sizes, "float32"), w, strides, dilations, padding, pads).shape


@pytest.mark.parametrize("fmt", ["NHWC", "NCHW"])
@pytest.mark.parametrize("padding", ["SAME", "VALID", "EXPLICIT"])
@pytest.mark.parametrize("size,strides,dilations", STEPS_2D)
@pytest.mark.parametrize("batch", [1, 2])
def test_conv2d_backprop_input(fmt, padding, size, strides, dilations, batch):
    w = random_array((3, 2, 4, 5))  # [kh, kw, forward in-channels (output), forward out-channels (input)]
    sizes = [batch, *size, 4]
    dy = random_array(out_backprop_shape(sizes, w, strides, dilations, padding))
    want = reference_conv_transpose(dy, sizes, w, strides, dilations, padding,
                                    EXPLICIT if padding == "EXPLICIT" else ())
    if fmt == "NHWC":
        engine, (got,) = run_engine(deconv2d(sizes, w, strides, dilations, padding), [dy])
    else:
        engine, (got,) = run_engine(deconv2d(sizes, w, strides, dilations, padding, "NCHW"), [dy.transpose(0, 3, 1, 2)])
        got = got.transpose(0, 2, 3, 1)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert "Deconvolution" in {layer.kind for layer in engine.network.layers}


def test_conv2d_transpose_layer():
    """What Keras' Conv2DTranspose computes (a constant output shape), plus its bias."""
    w, b = random_array((3, 3, 6, 4)), random_array((6,))
    fn = lambda t: tf.nn.bias_add(tf.nn.conv2d_transpose(t, w, [2, 10, 12, 6], strides=2, padding="SAME"), b)
    assert_converts(fn, [random_array((2, 5, 6, 4))], expect_kinds=["Deconvolution"])


@pytest.mark.parametrize("fmt", ["NDHWC", "NCDHW"])
@pytest.mark.parametrize("padding", ["SAME", "VALID"])
@pytest.mark.parametrize("size,strides,dilations", [((5, 6, 7), (1, 1, 1), (1, 1, 1)),
                                                    ((6, 7, 5), (2, 1, 3), (1, 1, 1)),
                                                    ((6, 7, 5), (1, 1, 1), (2, 1, 2))])
@pytest.mark.parametrize("batch", [1, 2])
def test_conv3d_backprop_input_v2(fmt, padding, size, strides, dilations, batch):
    w = random_array((2, 3, 2, 3, 4))
    sizes = [batch, *size, 3]
    attrs = dict(strides=[1, *strides, 1], dilations=[1, *dilations, 1], padding=padding)
    dy = random_array(out_backprop_shape(sizes, w, strides, dilations, padding))
    want = reference_conv_transpose(dy, sizes, w, strides, dilations, padding)
    op = lambda t, sizes, **a: tf.raw_ops.Conv3DBackpropInputV2(input_sizes=sizes, filter=w, out_backprop=t, **a)
    if fmt == "NDHWC":
        assert_converts(lambda t: op(t, sizes, **attrs), [dy], expected=[want], expect_kinds=["Deconvolution"])
        return
    perm = lambda v: [v[0], v[4], *v[1:4]]
    ncdhw = dict(attrs, strides=perm(attrs["strides"]), dilations=perm(attrs["dilations"]), data_format="NCDHW")
    _, (got,) = run_engine(lambda t: op(t, perm(sizes), **ncdhw), [dy.transpose(0, 4, 1, 2, 3)])
    want = np.transpose(want, (0, 4, 1, 2, 3))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def check(fn, specs, op):
    """The reason the converter gives for the first `op` node of `fn` traced with `specs`."""
    view = GraphView(frozen_graph_def(fn, specs)[0])
    node = next(n for n in view.nodes.values() if n.op == op)
    return get_converter(op).check(node, ValidationContext(view))


def test_nonconstant_input_sizes_are_refused():
    w = random_array((3, 3, 2, 4))
    fn = lambda t, sizes: tf.raw_ops.Conv2DBackpropInput(input_sizes=sizes, filter=w, out_backprop=t,
                                                         strides=[1, 1, 1, 1], padding="SAME")
    reason = check(fn, [tf.TensorSpec((1, 5, 5, 4)), tf.TensorSpec((4,), tf.int32)], "Conv2DBackpropInput")
    assert reason == "input 0 of Conv2DBackpropInput must be a constant"


def test_channel_stride_is_refused():
    w = random_array((3, 3, 2, 4))
    fn = lambda t: tf.raw_ops.Conv2DBackpropInput(input_sizes=[1, 5, 5, 2], filter=w, out_backprop=t,
                                                  strides=[1, 1, 1, 2], padding="SAME")
    assert "channel" in check(fn, [tf.TensorSpec((1, 5, 5, 4))], "Conv2DBackpropInput")
