"""Shape, ShapeN, Size and Rank: constants while building, since every engine shape is concrete then.

They add no layers: their int32 or int64 results (``out_type``) are Weights, which shape arithmetic downstream folds
(:meth:`~tftrt_py.convert.context.ConversionContext.add_layer`) and Reshape, Fill or Tile read.
The Weights remember the tensor they measured and which entry is its batch: used as data, they pin the
engine to its batch; as the dims of Fill, BroadcastTo or Tile they make rows of that batch.
"""
import numpy as np

from tftrt_py.convert.ops.base import FLOAT_INT_BOOL, INT64, NO_PRECISION, OpConverter
from tftrt_py.convert.ops.registry import register
from tftrt_py.convert.values import Weights, shape_of

__all__ = ["ShapeInfoConverter", "SHAPE_INFO"]

#: TF op -> its value from the input's shape (Weights of the out_type, see shape_of)
SHAPE_INFO = {
    "Shape": lambda shape: shape,
    "ShapeN": lambda shape: shape,
    "Size": lambda shape: Weights.derived(np.prod(shape.value).astype(shape.dtype), shape),
    "Rank": lambda shape: Weights(np.asarray(shape.value.size, shape.dtype)),
}
#: The out_types they take: int64 shapes (keras-hub CLIP's) fold like int32 ones
OUT_TYPES = ("int32", "int64")


@register(*SHAPE_INFO)
class ShapeInfoConverter(OpConverter):
    """The result is int32 or int64 (out_type)."""

    allowed_dtypes = FLOAT_INT_BOOL + INT64
    static_outputs = True
    precisions = NO_PRECISION

    def validate(self, node, ctx):
        out = node.attr("out_type", "int32")
        if out not in OUT_TYPES:
            return f"{node.op} with out_type={out} is not supported (supported: {', '.join(OUT_TYPES)})"
        return None

    def convert(self, node, ctx):
        values = ctx.inputs(node)
        if node.op != "ShapeN":
            values = values[:1]
        dtype = np.dtype(node.attr("out_type", "int32"))
        ctx.set_outputs(node, [SHAPE_INFO[node.op](shape_of(v, dtype)) for v in values])
