"""Element-wise ops with numpy broadcasting: binary ops as one ElementWise layer each, AddN as a
chain of sums, ClipByValue as a clip Activation (scalar constant bounds) or a min then a max."""
from tftrt_py.convert.ops.base import FLOAT_INT, INT64, OpConverter
from tftrt_py.convert.ops.registry import register
from tftrt_py.convert.values import Weights

__all__ = ["ElementWiseConverter", "IntElementWiseConverter", "AddNConverter", "ClipByValueConverter",
           "Int64ElementWiseConverter",
           "ELEMENTWISE", "INT_EXACT", "INT64_EXACT"]

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
    "FloorDiv": "floor_div",
    "FloorMod": "floor_mod",
}

#: ops of ELEMENTWISE that also convert for int32 (their integer results match TF's; the rest are float-only)
#: (Div truncates towards zero, FloorDiv and FloorMod round towards -inf; sums and products wrap on overflow)
INT_EXACT = ("Add", "AddV2", "Sub", "Mul", "Div", "Maximum", "Minimum", "FloorDiv", "FloorMod", "SquaredDifference")
#: ops of INT_EXACT that also convert for int64 (index arithmetic: wrapping sums and products, no divisions)
INT64_EXACT = ("Add", "AddV2", "Sub", "Mul", "Maximum", "Minimum")


@register(*(op for op in ELEMENTWISE if op not in INT_EXACT))
class ElementWiseConverter(OpConverter):
    """Numpy broadcasting; either operand may be a constant."""

    def convert(self, node, ctx):
        ctx.set_outputs(node, ctx.add_layer("ElementWise", ctx.inputs(node), {"op": ELEMENTWISE[node.op]}, node=node))


@register(*(op for op in INT_EXACT if op not in INT64_EXACT))
class IntElementWiseConverter(ElementWiseConverter):
    """Numpy broadcasting; either operand may be a constant; int32 too."""

    allowed_dtypes = FLOAT_INT


@register(*INT64_EXACT)
class Int64ElementWiseConverter(ElementWiseConverter):
    """Numpy broadcasting; either operand may be a constant; int32 and int64 too."""

    allowed_dtypes = FLOAT_INT + INT64


@register("AddN")
class AddNConverter(OpConverter):
    """The sum of N same-shaped inputs, left to right."""

    allowed_dtypes = FLOAT_INT

    def convert(self, node, ctx):
        total, *rest = ctx.inputs(node)
        for i, value in enumerate(rest):
            total = ctx.add_layer("ElementWise", [total, value], {"op": "sum"}, node=node,
                                  suffix=f"/add{i}" if i < len(rest) - 1 else "")[0]
        ctx.set_outputs(node, [total])


@register("ClipByValue")
class ClipByValueConverter(OpConverter):
    """min(max(t, lo), hi) as TF computes it: max(min(t, hi), lo), whatever the bounds' order."""

    allowed_dtypes = FLOAT_INT

    def convert(self, node, ctx):
        x, lo, hi = ctx.inputs(node)
        bounds = [float(v.value.ravel()[0]) if isinstance(v, Weights) and v.value.size == 1 else None for v in (lo, hi)]
        if x.dtype != "int32" and None not in bounds and bounds[0] <= bounds[1]:
            params = {"type": "clip", "alpha": bounds[0], "beta": bounds[1]}
            ctx.set_outputs(node, ctx.add_layer("Activation", [x], params, node=node))
            return
        y = ctx.add_layer("ElementWise", [x, hi], {"op": "min"}, node=node, suffix="/min")[0]
        ctx.set_outputs(node, ctx.add_layer("ElementWise", [y, lo], {"op": "max"}, node=node))
