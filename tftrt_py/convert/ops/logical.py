"""Comparisons, logical and bitwise ops, with numpy broadcasting.

Comparisons are one ElementWise layer each, LogicalAnd/LogicalOr and BitwiseAnd too; LogicalNot is one Unary layer.
"""
from tftrt_py.convert.ops.base import BOOL, EXACT_INT64, FLOAT_INT, INT, INT64, NO_PRECISION, OpConverter
from tftrt_py.convert.ops.registry import register

__all__ = ["CompareConverter", "EqualityConverter", "LogicalConverter", "BitwiseConverter", "COMPARISONS", "LOGICAL",
           "BITWISE"]

#: TF op -> ElementWise comparison
COMPARISONS = {"Greater": "greater", "GreaterEqual": "greater_equal", "Less": "less", "LessEqual": "less_equal",
               "Equal": "equal", "NotEqual": "not_equal"}
#: comparisons that also take bool operands
EQUALITY = ("Equal", "NotEqual")

#: TF op -> (layer kind, op); the operands are bool by the op's definition
LOGICAL = {"LogicalAnd": ("ElementWise", "and"), "LogicalOr": ("ElementWise", "or"), "LogicalNot": ("Unary", "not")}

#: TF op -> ElementWise op on the operands' bits
BITWISE = {"BitwiseAnd": "bitwise_and"}


@register(*(op for op in COMPARISONS if op not in EQUALITY))
class CompareConverter(OpConverter):
    allowed_dtypes = FLOAT_INT + INT64
    precisions = NO_PRECISION

    def convert(self, node, ctx):
        ctx.set_outputs(node, ctx.add_layer("ElementWise", ctx.inputs(node), {"op": COMPARISONS[node.op]}, node=node))


@register(*EQUALITY)
class EqualityConverter(CompareConverter):
    """bool operands too; with incompatible_shape_error=False (Python's ==) the static shapes must broadcast."""

    allowed_dtypes = EXACT_INT64

    def validate(self, node, ctx):
        if node.attr("incompatible_shape_error", True):
            return None
        a, b = (info.shape for info in ctx.input_infos(node))
        clash = a is None or b is None or any(x not in (y, 1, None) and y not in (1, None)
                                              for x, y in zip(a[::-1], b[::-1]))
        if clash:
            return f"{node.op} with incompatible_shape_error=False needs operand shapes known to broadcast"
        return None


@register(*LOGICAL)
class LogicalConverter(OpConverter):
    allowed_dtypes = BOOL  # fixed by the op: no dtype attribute to check
    dtype_attr = None
    precisions = NO_PRECISION

    def convert(self, node, ctx):
        kind, op = LOGICAL[node.op]
        ctx.set_outputs(node, ctx.add_layer(kind, ctx.inputs(node), {"op": op}, node=node))


@register(*BITWISE)
class BitwiseConverter(OpConverter):
    allowed_dtypes = INT
    precisions = NO_PRECISION

    def convert(self, node, ctx):
        ctx.set_outputs(node, ctx.add_layer("ElementWise", ctx.inputs(node), {"op": BITWISE[node.op]}, node=node))
