"""Cast between the engine's dtypes (one Identity layer producing the target dtype) and Bitcast between dtypes of
one item size (one Bitcast layer: the bits are kept, float32 <-> int32)."""
from tftrt_py.convert.ops.base import EXACT_INT64, NO_PRECISION, OpConverter
from tftrt_py.convert.ops.registry import register

__all__ = ["CastConverter", "BitcastConverter"]


@register("Cast")
class CastConverter(OpConverter):
    """SrcT and DstT in float32, float16, int32, bool, int64; Truncate=False (float to int rounds toward zero)."""

    allowed_dtypes = EXACT_INT64
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


@register("Bitcast")
class BitcastConverter(OpConverter):
    """T and type in float32, int32 (same item size: the shape is kept)."""

    allowed_dtypes = ("float32", "int32")
    dtype_attr = ("T", "type")
    precisions = NO_PRECISION

    def convert(self, node, ctx):
        x = ctx.inputs(node)[0]
        dtype = node.attr("type")
        if x.dtype == dtype:
            ctx.set_outputs(node, [x])
            return
        ctx.set_outputs(node, ctx.add_layer("Bitcast", [x], {"dtype": dtype}, node=node))
