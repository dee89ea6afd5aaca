"""Transposed convolutions (the input gradients of Conv2D and Conv3D) as one Deconvolution layer.

The forward convolution's input shape (``input_sizes``) and the filter are constants; the
filter [*K, C_out, C_in] is the Deconvolution kernel as is, with dilations written into it as zeros.
"""
import numpy as np

from tftrt_py.convert.ops.base import ANY, WEIGHT, OpConverter
from tftrt_py.convert.ops.conv import (LAYOUTS, data_format, from_channels_last, layout_reason, padding, spatial,
                                       to_channels_last)
from tftrt_py.convert.ops.registry import register
from tftrt_py.engine.layer_geometry import conv_output_size

__all__ = ["DeconvConverter", "DECONVOLUTIONS", "dilate"]

#: TF op -> number of spatial dimensions
DECONVOLUTIONS = {"Conv2DBackpropInput": 2, "Conv3DBackpropInputV2": 3}


def dilate(kernel, dilations):
    """`kernel` [*K, ...] with dilation - 1 zeros between taps along each spatial axis."""
    nsp = len(dilations)
    shape = [d * (k - 1) + 1 for k, d in zip(kernel.shape[:nsp], dilations)] + list(kernel.shape[nsp:])
    out = np.zeros(shape, kernel.dtype)
    out[tuple(slice(None, None, d) for d in dilations)] = kernel
    return out


@register(*DECONVOLUTIONS)
class DeconvConverter(OpConverter):
    """Constant input_sizes and filter; SAME, VALID or EXPLICIT padding; strides and dilations."""

    input_spec = (WEIGHT, WEIGHT, ANY)

    def validate(self, node, ctx):
        reason = layout_reason(node)
        if reason:
            return reason
        sizes, w, dy = ctx.input_infos(node)
        nsp = DECONVOLUTIONS[node.op]
        sizes = [int(s) for s in np.ravel(sizes.value)]
        if len(sizes) != nsp + 2 or w.value.ndim != nsp + 2:
            return f"input_sizes {sizes} and filter {list(w.value.shape)} must have {nsp + 2} dims"
        axes, channel = LAYOUTS[data_format(node)]
        if sizes[channel] != w.value.shape[-2]:
            return f"input_sizes channels {sizes[channel]} != the filter's {w.value.shape[-2]}"
        if dy.shape is not None and dy.shape[channel] not in (None, w.value.shape[-1]):
            return f"out_backprop channels {dy.shape[channel]} != the filter's {w.value.shape[-1]}"
        expected = self.forward_sizes(node, [sizes[a] for a in axes], w.value.shape[:nsp])
        got = None if dy.shape is None else [dy.shape[a] for a in axes]
        if got is not None and None not in got and got != expected:
            return f"out_backprop spatial size {got} does not match the forward convolution's {expected}"
        return None

    @staticmethod
    def forward_sizes(node, sizes, window):
        """Spatial output size of the forward convolution of `sizes`."""
        strides, dilations = spatial(node, "strides"), spatial(node, "dilations")
        pre, post = padding(node, sizes, window, strides, dilations)
        return [conv_output_size(*args) for args in zip(sizes, window, strides, dilations, pre, post)]

    def convert(self, node, ctx):
        sizes, w, dy = ctx.inputs(node)
        nsp = DECONVOLUTIONS[node.op]
        out_sp = [int(np.ravel(sizes.value)[a]) for a in LAYOUTS[data_format(node)][0]]
        strides, dilations = spatial(node, "strides"), spatial(node, "dilations")
        pre, _ = padding(node, out_sp, w.value.shape[:nsp], strides, dilations)
        x = to_channels_last(ctx, node, dy)
        params = {"strides": strides, "pre_padding": pre, "output_spatial": out_sp}
        weights = {"kernel": np.asarray(dilate(w.value, dilations), x.dtype)}
        y = ctx.add_layer("Deconvolution", [x], params, weights, node=node)[0]
        ctx.set_outputs(node, [from_channels_last(ctx, node, y)])
