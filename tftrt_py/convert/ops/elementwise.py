"""Binary element-wise ops with numpy broadcasting: one ElementWise layer each."""
from tftrt_py.convert.ops.base import OpConverter
from tftrt_py.convert.ops.registry import register

__all__ = ["ElementWiseConverter", "ELEMENTWISE"]

#: TF op -> ElementWise op
ELEMENTWISE = {
    "Add": "sum",
    "AddV2": "sum",
    "Sub": "sub",
    "Mul": "prod",
    "RealDiv": "div",
    "Div": "div",
    "Maximum": "max",
    "Minimum": "min",
    "Pow": "pow",
    "SquaredDifference": "squared_difference",
}


@register(*ELEMENTWISE)
class ElementWiseConverter(OpConverter):
    def convert(self, node, ctx):
        ctx.set_outputs(node, ctx.add_layer("ElementWise", ctx.inputs(node), {"op": ELEMENTWISE[node.op]}, node=node))
