"""Cast between float32, float16, int32 and bool: one Identity layer producing the target dtype."""
from tftrt_py.convert.ops.base import FLOAT_INT_BOOL, NO_PRECISION, OpConverter
from tftrt_py.convert.ops.registry import register

__all__ = ["CastConverter"]


@register("Cast")
class CastConverter(OpConverter):
    """SrcT and DstT in float32, float16, int32, bool; Truncate=False (float to int rounds toward zero)."""

    allowed_dtypes = FLOAT_INT_BOOL
    dtype_attr = ("SrcT", "DstT")
    precisions = NO_PRECISION

    def validate(self, node, ctx):
        if node.attr("Truncate", False):
            return "Cast with Truncate=True is not supported"
        return None

    def convert(self, node, ctx):
        x = ctx.inputs(node)[0]
        if x.dtype == node.attr("DstT"):
            ctx.set_outputs(node, [x])
            return
        ctx.set_outputs(node, ctx.add_layer("Identity", [x], {"dtype": node.attr("DstT")}, node=node))
