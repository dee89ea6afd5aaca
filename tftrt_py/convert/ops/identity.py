"""Const and the pass-through ops: they add no layers, only forward values."""
from tftrt_py.convert.ops.base import EXACT_INT64, NO_PRECISION, OpConverter
from tftrt_py.convert.ops.registry import register
from tftrt_py.convert.values import Weights

__all__ = ["ConstConverter", "PassThroughConverter"]

#: Ops that forward their inputs unchanged (IdentityN counts towards minimum_segment_size, as in TF-TRT).
PASS_THROUGH = ("Identity", "IdentityN", "Snapshot", "StopGradient")


@register("Const")
class ConstConverter(OpConverter):
    allowed_dtypes = EXACT_INT64
    dtype_attr = "dtype"
    precisions = NO_PRECISION

    def convert(self, node, ctx):
        ctx.set_outputs(node, [Weights(node.attr("value"))])


@register(*PASS_THROUGH)
class PassThroughConverter(OpConverter):
    """Output i is input i (IdentityN forwards several, as tf.custom_gradient functions such as silu emit)."""

    allowed_dtypes = EXACT_INT64
    precisions = NO_PRECISION

    def convert(self, node, ctx):
        ctx.set_outputs(node, ctx.inputs(node))
