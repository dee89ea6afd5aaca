"""Conv2D, DepthwiseConv2dNative, Conv3D and FusedConv2DBiasActivation become one Convolution layer and
match TensorFlow.

The reference is support.reference_conv (TF's default CPU kernels reject unequal depthwise strides, depthwise
and Conv3D dilations); NCHW graphs are traced with tf.raw_ops and compared with it on transposed data (TF's CPU
kernels are NHWC).
"""
import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.framework import graph_pb2

from support import assert_converts, frozen_graph_def, random_array, reference_conv, run_engine
from tftrt_py.convert.build import INPUT_PREFIX, OUTPUT_PREFIX, build_engine
from tftrt_py.convert.context import ValidationContext
from tftrt_py.convert.errors import ConversionError
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


def assert_nchw_converts(op, x, attrs, want):
    """`op` traced for NCHW converts to `want` (the NHWC result on `x`) transposed."""
    _, (got,) = run_engine(lambda t: op(t, **nchw_attrs(attrs)), [x.transpose(0, 3, 1, 2)])
    want = np.transpose(want, (0, 3, 1, 2))
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
    want = reference_conv(x, w, strides, dilations, padding, attrs["explicit_paddings"],
                          depthwise=op == "DepthwiseConv2dNative")
    if fmt == "NHWC":
        assert_converts(lambda t: conv(t, **attrs), [x], expected=[want], expect_kinds=["Convolution"])
    else:
        assert_nchw_converts(conv, x, attrs, want)


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


# -- Conv3D -----------------------------------------------------------------------------------------
#: (strides, dilations) per spatial dim
STEPS_3D = [((1, 1, 1), (1, 1, 1)), ((2, 1, 3), (1, 1, 1)), ((1, 2, 1), (2, 1, 2))]


def ndhwc_attrs(strides, dilations, padding):
    return dict(strides=[1, *strides, 1], dilations=[1, *dilations, 1], padding=padding, data_format="NDHWC")


@pytest.mark.parametrize("fmt", ["NDHWC", "NCDHW"])
@pytest.mark.parametrize("padding", ["SAME", "VALID"])
@pytest.mark.parametrize("strides,dilations", STEPS_3D)
@pytest.mark.parametrize("batch", [1, 2])
def test_conv3d_matches_tf(fmt, padding, strides, dilations, batch):
    """Conv3D in both layouts (NCDHW compared with the NDHWC reference on transposed data)."""
    w = random_array((3, 2, 3, 3, 4))
    x, attrs = random_array((batch, 6, 7, 8, 3)), ndhwc_attrs(strides, dilations, padding)
    conv = lambda t, **a: tf.raw_ops.Conv3D(input=t, filter=w, **a)
    want = reference_conv(x, w, strides, dilations, padding)
    if fmt == "NDHWC":
        assert_converts(lambda t: conv(t, **attrs), [x], expected=[want], expect_kinds=["Convolution"])
        return
    perm = lambda v: [v[0], v[4], *v[1:4]]
    ncdhw = dict(attrs, strides=perm(attrs["strides"]), dilations=perm(attrs["dilations"]), data_format="NCDHW")
    _, (got,) = run_engine(lambda t: conv(t, **ncdhw), [x.transpose(0, 4, 1, 2, 3)])
    want = np.transpose(want, (0, 4, 1, 2, 3))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_conv3d_channel_stride_is_refused():
    w = random_array((1, 1, 1, 3, 2))
    fn = lambda t: tf.raw_ops.Conv3D(input=t, filter=w, strides=[1, 1, 1, 1, 2], padding="SAME")
    assert "channel" in check(fn, tf.TensorSpec((1, 4, 4, 4, 3)), "Conv3D")


# -- FusedConv2DBiasActivation (not registered in TF's CPU build: hand-built segments) ---------------
def _const(graph_def, name, value):
    node = graph_def.node.add(name=name, op="Const")
    node.attr["dtype"].type = tf.as_dtype(np.asarray(value).dtype).as_datatype_enum
    node.attr["value"].tensor.CopyFrom(tf.make_tensor_proto(np.asarray(value)))


def fused_conv_segment(x, w, bias, side, conv_scale, side_scale, scales_as_inputs=True, **attrs):
    """A segment GraphDef around one FusedConv2DBiasActivation node: input 0 is x, input 1 the side
    input when `side` is not None (else side_input is an empty constant)."""
    graph_def = graph_pb2.GraphDef()
    feeds = [x] if side is None else [x, side]
    for i, value in enumerate(feeds):
        ph = graph_def.node.add(name=f"{INPUT_PREFIX}{i}", op="Placeholder")
        ph.attr["dtype"].type = tf.float32.as_datatype_enum
        ph.attr["shape"].shape.CopyFrom(tf.TensorShape(value.shape).as_proto())
    _const(graph_def, "filter", w)
    _const(graph_def, "bias", bias)
    if side is None:
        _const(graph_def, "side", np.zeros((0,), "float32"))
    inputs = [f"{INPUT_PREFIX}0", "filter", "bias", f"{INPUT_PREFIX}1" if side is not None else "side"]
    node = graph_def.node.add(name="fused", op="FusedConv2DBiasActivation")
    if scales_as_inputs:
        _const(graph_def, "conv_scale", np.float32(conv_scale))
        _const(graph_def, "side_scale", np.float32(side_scale))
        inputs += ["conv_scale", "side_scale"]
    else:
        node.attr["conv_input_scale"].f = conv_scale
        node.attr["side_input_scale"].f = side_scale
    node.input.extend(inputs)
    node.attr["T"].type = node.attr["Tbias"].type = tf.float32.as_datatype_enum
    for key, value in attrs.items():
        if isinstance(value, list):
            node.attr[key].list.i.extend(value)
        else:
            node.attr[key].s = value.encode()
    out = graph_def.node.add(name=f"{OUTPUT_PREFIX}0", op="Identity", input=["fused"])
    out.attr["T"].type = tf.float32.as_datatype_enum
    return graph_def, feeds


def fused_conv_expected(x, w, bias, side, conv_scale, side_scale, strides, padding, mode):
    """The op's documented result, computed with TF's NHWC Conv2D."""
    y = conv_scale * tf.nn.conv2d(x, w, [1, *strides, 1], padding).numpy() + bias
    if side is not None:
        y = y + side_scale * side
    return np.maximum(y, 0) if mode == "Relu" else y


@pytest.mark.parametrize("fmt", ["NHWC", "NCHW"])
@pytest.mark.parametrize("filter_format", ["HWIO", "OIHW"])
@pytest.mark.parametrize("mode", ["Relu", "None"])
@pytest.mark.parametrize("with_side", [False, True])
@pytest.mark.parametrize("padding,strides", [("SAME", (1, 1)), ("VALID", (2, 1))])
@pytest.mark.parametrize("batch", [1, 2])
def test_fused_conv2d_bias_activation(fmt, filter_format, mode, with_side, padding, strides, batch):
    x, w, bias = random_array((batch, 7, 6, 3)), random_array((3, 3, 3, 4)), random_array((4,))
    out_shape = tf.nn.conv2d(x, w, [1, *strides, 1], padding).shape
    side = random_array(out_shape) if with_side else None
    conv_scale, side_scale = 0.75, (1.5 if with_side else 0.0)
    want = fused_conv_expected(x, w, bias, side, conv_scale, side_scale, strides, padding, mode)
    to_nchw = (lambda a: a.transpose(0, 3, 1, 2)) if fmt == "NCHW" else (lambda a: a)
    stride_attr = [1, 1, *strides] if fmt == "NCHW" else [1, *strides, 1]
    graph_def, feeds = fused_conv_segment(
        to_nchw(x), w.transpose(3, 2, 0, 1) if filter_format == "OIHW" else w, bias,
        None if side is None else to_nchw(side), conv_scale, side_scale, strides=stride_attr, padding=padding,
        data_format=fmt, filter_format=filter_format, activation_mode=mode)
    engine = build_engine(graph_def, [f.shape for f in feeds])
    (got,) = engine.create_execution_context().execute_v2(feeds)
    np.testing.assert_allclose(got, to_nchw(want), rtol=1e-5, atol=1e-5)
    assert "Convolution" in {layer.kind for layer in engine.network.layers}


def test_fused_conv2d_scales_as_attributes():
    """The first op version kept conv_input_scale and side_input_scale as attributes."""
    x, w, bias = random_array((2, 5, 5, 3)), random_array((3, 3, 3, 2)), random_array((2,))
    side = random_array((2, 5, 5, 2))
    graph_def, feeds = fused_conv_segment(x, w, bias, side, 2.0, -0.5, scales_as_inputs=False, strides=[1, 1, 1, 1],
                                          padding="SAME")
    (got,) = build_engine(graph_def, [f.shape for f in feeds]).create_execution_context().execute_v2(feeds)
    want = fused_conv_expected(x, w, bias, side, 2.0, -0.5, (1, 1), "SAME", "Relu")
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("attrs,words", [(dict(activation_mode="Sigmoid"), "activation_mode"),
                                         (dict(filter_format="OIHW_VECT_I"), "filter_format"),
                                         (dict(data_format="NCHW_VECT_C"), "data_format")])
def test_fused_conv2d_refusals(attrs, words):
    """What the Convolution layer cannot express is refused, with the attribute named."""
    graph_def, feeds = fused_conv_segment(random_array((1, 4, 4, 3)), random_array((1, 1, 3, 2)), random_array((2,)),
                                          None, 1.0, 0.0, strides=[1, 1, 1, 1], padding="SAME", **attrs)
    with pytest.raises(ConversionError, match=words):
        build_engine(graph_def, [f.shape for f in feeds])
