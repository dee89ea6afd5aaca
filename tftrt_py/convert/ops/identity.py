"""Const and the pass-through ops: they add no layers, only forward values."""
from tftrt_py.convert.context import Weights
from tftrt_py.convert.ops.base import OpConverter
from tftrt_py.convert.ops.base import FLOAT_INT_BOOL
from tftrt_py.convert.ops.registry import register

__all__ = ["ConstConverter", "PassThroughConverter"]

#: Ops that forward their input unchanged; they do not count towards minimum_segment_size.
PASS_THROUGH = ("Identity", "Snapshot", "StopGradient")


@register("Const")
class ConstConverter(OpConverter):
    allowed_dtypes = FLOAT_INT_BOOL
    dtype_attr = "dtype"

    def convert(self, node, ctx):
        ctx.set_outputs(node, [Weights(node.attr("value"))])


@register(*PASS_THROUGH)
class PassThroughConverter(OpConverter):
    allowed_dtypes = FLOAT_INT_BOOL

    def convert(self, node, ctx):
        ctx.set_outputs(node, ctx.inputs(node)[:1])
