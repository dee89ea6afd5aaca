"""Convolutions (2-d, depthwise, 3-d, and the fused conv + bias + activation) as one channels-last
Convolution layer; channels-first layouts go through two Shuffles.

Also the layout helpers pooling and deconv share: the data format, spatial attribute entries,
TF's padding rules and the channels-first <-> channels-last transposes.
"""
import math

import numpy as np

from tftrt_py.convert.ops.base import ANY, WEIGHT, OpConverter
from tftrt_py.convert.ops.registry import register

__all__ = ["ConvConverter", "FusedConvConverter", "CONVOLUTIONS", "FUSED_ACTIVATIONS", "data_format",
           "layout_reason", "spatial", "padding", "to_channels_last", "from_channels_last", "convolution"]

#: TF op -> whether it is depthwise (filter [kh, kw, C, multiplier] instead of [*K, C/groups, Cout])
CONVOLUTIONS = {"Conv2D": False, "DepthwiseConv2dNative": True, "Conv3D": False}

#: data_format -> (spatial axes, channel axis)
LAYOUTS = {b"NHWC": ((1, 2), 3), b"NCHW": ((2, 3), 1), b"NDHWC": ((1, 2, 3), 4), b"NCDHW": ((2, 3, 4), 1)}

#: FusedConv2DBiasActivation activation_mode -> Convolution activation type (None: no activation)
FUSED_ACTIVATIONS = {b"Relu": "relu", b"None": None}
#: FusedConv2DBiasActivation filter_format -> transpose to HWIO
FILTER_FORMATS = {b"HWIO": None, b"OIHW": (2, 3, 1, 0)}


def data_format(node):
    """The node's data_format, defaulting to channels-last for its rank (5-entry strides: 3-d)."""
    fmt = node.attr("data_format")
    if fmt is not None:
        return fmt
    return b"NDHWC" if len(node.attr("strides") or ()) == 5 else b"NHWC"


def layout_reason(node, attrs=("strides", "dilations")):
    """Why the node's data_format or per-dimension `attrs` cannot map to the engine, or None."""
    fmt = data_format(node)
    if fmt not in LAYOUTS:
        return f"data_format {fmt.decode()} is not supported (supported: {', '.join(f.decode() for f in LAYOUTS)})"
    _, channel = LAYOUTS[fmt]
    for key in attrs:
        values = node.attr(key)
        if values is not None and (values[0] != 1 or values[channel] != 1):
            return f"{key} {values} on the batch or channel dimension are not supported"
    return None


def spatial(node, key, default=1):
    """The spatial entries of a per-dimension attribute (strides, dilations, ksize)."""
    axes, _ = LAYOUTS[data_format(node)]
    values = node.attr(key) or [default] * (len(axes) + 2)
    return [int(values[a]) for a in axes]


def padding(node, sizes, window, strides, dilations):
    """(pre, post) spatial padding exactly as TF computes it for SAME, VALID and EXPLICIT."""
    pad = node.attr("padding")
    if pad == b"VALID":
        return [0] * len(sizes), [0] * len(sizes)
    if pad == b"EXPLICIT":
        explicit = node.attr("explicit_paddings")
        axes = LAYOUTS[data_format(node)][0]
        return [int(explicit[2 * a]) for a in axes], [int(explicit[2 * a + 1]) for a in axes]
    totals = [max((math.ceil(n / s) - 1) * s + (k - 1) * d + 1 - n, 0)
              for n, k, s, d in zip(sizes, window, strides, dilations)]
    return [t // 2 for t in totals], [t - t // 2 for t in totals]


def _to_last_perm(node):
    """The transpose to channels-last, or None when the node is channels-last already."""
    axes, channel = LAYOUTS[data_format(node)]
    return None if channel == len(axes) + 1 else [0, *axes, channel]


def to_channels_last(ctx, node, x, suffix="/to_channels_last"):
    perm = _to_last_perm(node)
    if perm is None:
        return x
    return ctx.add_layer("Shuffle", [x], {"first_perm": perm}, node=node, suffix=suffix)[0]


def from_channels_last(ctx, node, y):
    perm = _to_last_perm(node)
    if perm is None:
        return y
    return ctx.add_layer("Shuffle", [y], {"first_perm": [int(i) for i in np.argsort(perm)]}, node=node,
                         suffix="/to_channels_first")[0]


def convolution(ctx, node, inputs, kernel, groups=1, bias=None, activation=None):
    """One Convolution layer over channels-last `inputs` (x, then an optional residual) with the node's
    strides, dilations and padding; returns its output."""
    x = inputs[0]
    nsp = kernel.ndim - 2
    strides, dilations = spatial(node, "strides"), spatial(node, "dilations")
    pre, post = padding(node, x.shape[1:1 + nsp], kernel.shape[:nsp], strides, dilations)
    params = {"strides": strides, "dilations": dilations, "pre_padding": pre, "post_padding": post,
              "groups": groups}
    weights = {"kernel": np.asarray(kernel, x.dtype)}
    if bias is not None:
        weights["bias"] = np.asarray(bias, x.dtype)
    if activation is not None:
        params["activation"] = {"type": activation}
    return ctx.add_layer("Convolution", inputs, params, weights, node=node)[0]


@register(*CONVOLUTIONS)
class ConvConverter(OpConverter):
    """Conv2D and Conv3D (grouped when the input has a multiple of the filter's channels) and
    DepthwiseConv2dNative."""

    input_spec = (ANY, WEIGHT)

    def validate(self, node, ctx):
        reason = layout_reason(node)
        if reason:
            return reason
        x, w = ctx.input_infos(node)
        channels = x.shape[LAYOUTS[data_format(node)][1]] if x.rank == w.value.ndim else None
        if not CONVOLUTIONS[node.op] and channels is not None and channels % w.value.shape[-2]:
            return f"input channels {channels} are not a multiple of the filter's {w.value.shape[-2]}"
        return None

    def convert(self, node, ctx):
        x, w = ctx.inputs(node)
        x = to_channels_last(ctx, node, x)
        kernel = w.value
        if CONVOLUTIONS[node.op]:
            kh, kw, c, m = kernel.shape
            kernel, groups = kernel.reshape(kh, kw, 1, c * m), c
        else:
            groups = x.shape[-1] // kernel.shape[-2]
        y = convolution(ctx, node, [x], kernel, groups)
        ctx.set_outputs(node, [from_channels_last(ctx, node, y)])


@register("FusedConv2DBiasActivation")
class FusedConvConverter(OpConverter):
    """activation(conv_input_scale * conv(x, filter) + side_input_scale * side_input + bias).

    The conv scale folds into the kernel; a non-zero side_input_scale makes the scaled side input
    the Convolution's residual input. The scales are inputs 4 and 5 (later op versions) or attributes.
    """

    input_spec = (ANY, WEIGHT, WEIGHT, ANY, WEIGHT)

    def validate(self, node, ctx):
        reason = layout_reason(node)
        if reason:
            return reason
        fmt, mode = node.attr("filter_format", b"HWIO"), node.attr("activation_mode", b"Relu")
        if fmt not in FILTER_FORMATS:
            return f"filter_format {fmt.decode()} is not supported (supported: HWIO, OIHW)"
        if mode not in FUSED_ACTIVATIONS:
            return f"activation_mode {mode.decode()} is not supported (supported: Relu, None)"
        return None

    @staticmethod
    def scales(node, values):
        if len(values) > 4:
            return float(np.ravel(values[4].value)[0]), float(np.ravel(values[5].value)[0])
        return float(node.attr("conv_input_scale", 1.0)), float(node.attr("side_input_scale", 0.0))

    def convert(self, node, ctx):
        values = ctx.inputs(node)
        x, w, bias, side = values[:4]
        conv_scale, side_scale = self.scales(node, values)
        perm = FILTER_FORMATS[node.attr("filter_format", b"HWIO")]
        kernel = (w.value if perm is None else w.value.transpose(perm)) * conv_scale
        inputs = [to_channels_last(ctx, node, x)]
        if side_scale != 0.0:
            side = ctx.add_layer("Scale", [side], {}, {"scale": np.asarray([side_scale], inputs[0].dtype)},
                                 node=node, suffix="/side_scale")[0]
            inputs.append(to_channels_last(ctx, node, side, suffix="/side_to_channels_last"))
        y = convolution(ctx, node, inputs, kernel, bias=bias.value,
                        activation=FUSED_ACTIVATIONS[node.attr("activation_mode", b"Relu")])
        ctx.set_outputs(node, [from_channels_last(ctx, node, y)])
