"""Unary math ops: one Unary layer each."""
from tftrt_py.convert.ops.base import FLOAT_INT, OpConverter
from tftrt_py.convert.ops.registry import register

__all__ = ["UnaryConverter", "IntUnaryConverter", "UNARY", "INT_EXACT"]

#: TF op -> Unary op
UNARY = {
    "Exp": "exp", "Log": "log", "Sqrt": "sqrt", "Rsqrt": "rsqrt", "Reciprocal": "recip", "Inv": "recip",
    "Abs": "abs", "Neg": "neg", "Sin": "sin", "Cos": "cos", "Tan": "tan", "Sinh": "sinh", "Cosh": "cosh",
    "Asin": "asin", "Acos": "acos", "Atan": "atan", "Asinh": "asinh", "Acosh": "acosh", "Atanh": "atanh",
    "Ceil": "ceil", "Floor": "floor", "Round": "round", "Sign": "sign", "Erf": "erf", "Erfc": "erfc",
    "Square": "square",
}

#: ops of UNARY that also convert for int32 (exact, wrapping on overflow as TF does; the rest are float-only)
INT_EXACT = ("Abs", "Neg", "Sign", "Square")


@register(*(op for op in UNARY if op not in INT_EXACT))
class UnaryConverter(OpConverter):
    def convert(self, node, ctx):
        ctx.set_outputs(node, ctx.add_layer("Unary", ctx.inputs(node)[:1], {"op": UNARY[node.op]}, node=node))


@register(*INT_EXACT)
class IntUnaryConverter(UnaryConverter):
    """One Unary layer; int32 too, wrapping as TF does (Abs and Neg of -2**31 give -2**31)."""

    allowed_dtypes = FLOAT_INT
