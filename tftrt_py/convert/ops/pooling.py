"""Max and average pooling, 2-d and 3-d, as one channels-last Pooling layer (channels-first layouts
go through two Shuffles)."""
from tftrt_py.convert.ops.base import OpConverter
from tftrt_py.convert.ops.conv import from_channels_last, layout_reason, padding, spatial, to_channels_last
from tftrt_py.convert.ops.registry import register

__all__ = ["PoolingConverter", "POOLING"]

#: TF op -> Pooling type
POOLING = {"MaxPool": "max", "AvgPool": "avg", "MaxPool3D": "max", "AvgPool3D": "avg"}


@register(*POOLING)
class PoolingConverter(OpConverter):
    """NHWC or NCHW (2-d), NDHWC or NCDHW (3-d); SAME or VALID padding; no pooling over batch or channels.
    Average pooling divides by the window's count of non-padding elements, as TF does."""

    def validate(self, node, ctx):
        return layout_reason(node, ("ksize", "strides"))

    def convert(self, node, ctx):
        x = to_channels_last(ctx, node, ctx.inputs(node)[0])
        window, strides = spatial(node, "ksize"), spatial(node, "strides")
        nsp = len(window)
        pre, post = padding(node, x.shape[1:1 + nsp], window, strides, [1] * nsp)
        params = {"type": POOLING[node.op], "window": window, "strides": strides, "pre_padding": pre,
                  "post_padding": post, "count_include_pad": False}
        y = ctx.add_layer("Pooling", [x], params, node=node)[0]
        ctx.set_outputs(node, [from_channels_last(ctx, node, y)])
