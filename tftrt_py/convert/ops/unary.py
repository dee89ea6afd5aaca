"""Unary math ops: one Unary layer each."""
from tftrt_py.convert.ops.base import OpConverter
from tftrt_py.convert.ops.registry import register

__all__ = ["UnaryConverter", "UNARY"]

#: TF op -> Unary op
UNARY = {
    "Exp": "exp", "Log": "log", "Sqrt": "sqrt", "Rsqrt": "rsqrt", "Reciprocal": "recip", "Inv": "recip",
    "Abs": "abs", "Neg": "neg", "Sin": "sin", "Cos": "cos", "Tan": "tan", "Sinh": "sinh", "Cosh": "cosh",
    "Asin": "asin", "Acos": "acos", "Atan": "atan", "Asinh": "asinh", "Acosh": "acosh", "Atanh": "atanh",
    "Ceil": "ceil", "Floor": "floor", "Round": "round", "Sign": "sign", "Erf": "erf", "Erfc": "erfc",
    "Square": "square",
}


@register(*UNARY)
class UnaryConverter(OpConverter):
    def convert(self, node, ctx):
        ctx.set_outputs(node, ctx.add_layer("Unary", ctx.inputs(node)[:1], {"op": UNARY[node.op]}, node=node))
