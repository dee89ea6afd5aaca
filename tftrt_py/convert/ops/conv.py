"""2-d convolutions as one channels-last Convolution layer (NCHW goes through two Shuffles).

Also the layout helpers pooling shares: spatial attribute entries, TF's padding rules and
the NCHW <-> NHWC transposes.
"""
import math

import numpy as np

from tftrt_py.convert.ops.base import ANY, WEIGHT, OpConverter
from tftrt_py.convert.ops.registry import register

__all__ = ["ConvConverter", "CONVOLUTIONS", "layout_reason", "spatial", "padding", "to_channels_last",
           "from_channels_last"]

#: TF op -> whether it is depthwise (filter [kh, kw, C, multiplier] instead of [kh, kw, C/groups, Cout])
CONVOLUTIONS = {"Conv2D": False, "DepthwiseConv2dNative": True}

#: data_format -> (spatial axes, channel axis) of a 4-d tensor
LAYOUTS = {b"NHWC": ((1, 2), 3), b"NCHW": ((2, 3), 1)}
TO_NHWC, TO_NCHW = [0, 2, 3, 1], [0, 3, 1, 2]


def layout_reason(node, attrs=("strides", "dilations")):
    """Why the node's data_format or 4-entry `attrs` cannot map to the engine, or None."""
    fmt = node.attr("data_format", b"NHWC")
    if fmt not in LAYOUTS:
        return f"data_format {fmt.decode()} is not supported (supported: NHWC, NCHW)"
    _, channel = LAYOUTS[fmt]
    for key in attrs:
        values = node.attr(key)
        if values is not None and (values[0] != 1 or values[channel] != 1):
            return f"{key} {values} on the batch or channel dimension are not supported"
    return None


def spatial(node, key, default=1):
    """The spatial entries of a 4-entry attribute (strides, dilations, ksize)."""
    values = node.attr(key) or [default] * 4
    return [int(values[a]) for a in LAYOUTS[node.attr("data_format", b"NHWC")][0]]


def padding(node, sizes, window, strides, dilations):
    """(pre, post) spatial padding exactly as TF computes it for SAME, VALID and EXPLICIT."""
    pad = node.attr("padding")
    if pad == b"VALID":
        return [0] * len(sizes), [0] * len(sizes)
    if pad == b"EXPLICIT":
        explicit = node.attr("explicit_paddings")
        axes = LAYOUTS[node.attr("data_format", b"NHWC")][0]
        return [int(explicit[2 * a]) for a in axes], [int(explicit[2 * a + 1]) for a in axes]
    totals = [max((math.ceil(n / s) - 1) * s + (k - 1) * d + 1 - n, 0)
              for n, k, s, d in zip(sizes, window, strides, dilations)]
    return [t // 2 for t in totals], [t - t // 2 for t in totals]


def to_channels_last(ctx, node, x):
    if node.attr("data_format", b"NHWC") == b"NHWC":
        return x
    return ctx.add_layer("Shuffle", [x], {"first_perm": TO_NHWC}, node=node, suffix="/to_nhwc")[0]


def from_channels_last(ctx, node, y):
    if node.attr("data_format", b"NHWC") == b"NHWC":
        return y
    return ctx.add_layer("Shuffle", [y], {"first_perm": TO_NCHW}, node=node, suffix="/to_nchw")[0]


@register(*CONVOLUTIONS)
class ConvConverter(OpConverter):
    """Conv2D (grouped when the input has a multiple of the filter's channels) and DepthwiseConv2dNative."""

    input_spec = (ANY, WEIGHT)

    def validate(self, node, ctx):
        reason = layout_reason(node)
        if reason:
            return reason
        x, w = ctx.input_infos(node)
        channels = x.shape[LAYOUTS[node.attr("data_format", b"NHWC")][1]] if x.rank == 4 else None
        if not CONVOLUTIONS[node.op] and channels is not None and channels % w.value.shape[2]:
            return f"input channels {channels} are not a multiple of the filter's {w.value.shape[2]}"
        return None

    def convert(self, node, ctx):
        x, w = ctx.inputs(node)
        x = to_channels_last(ctx, node, x)
        kernel = w.value
        if CONVOLUTIONS[node.op]:
            kh, kw, c, m = kernel.shape
            kernel, groups = kernel.reshape(kh, kw, 1, c * m), c
        else:
            groups = x.shape[-1] // kernel.shape[2]
        strides, dilations = spatial(node, "strides"), spatial(node, "dilations")
        pre, post = padding(node, x.shape[1:3], kernel.shape[:2], strides, dilations)
        params = {"strides": strides, "dilations": dilations, "pre_padding": pre, "post_padding": post,
                  "groups": groups}
        y = ctx.add_layer("Convolution", [x], params, {"kernel": np.asarray(kernel, x.dtype)}, node=node)[0]
        ctx.set_outputs(node, [from_channels_last(ctx, node, y)])
