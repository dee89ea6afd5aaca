"""Softmax over the last axis: one Softmax layer."""
from tftrt_py.convert.ops.base import OpConverter
from tftrt_py.convert.ops.registry import register

__all__ = ["SoftmaxConverter"]


@register("Softmax")
class SoftmaxConverter(OpConverter):
    def convert(self, node, ctx):
        x = ctx.inputs(node)[0]
        ctx.set_outputs(node, ctx.add_layer("Softmax", [x], {"axis": len(x.shape) - 1}, node=node))
