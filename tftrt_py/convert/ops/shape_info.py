"""Shape, ShapeN, Size and Rank: constants while building, since every engine shape is concrete then.

They add no layers: their int32 results are Weights, which shape arithmetic downstream folds
(:meth:`~tftrt_py.convert.context.ConversionContext.add_layer`) and Reshape, Fill or Tile read.
The Weights remember the tensor they measured: used as data, they pin the engine to its batch.
"""
import numpy as np

from tftrt_py.convert.context import Weights
from tftrt_py.convert.ops.base import FLOAT_INT_BOOL, NO_PRECISION, OpConverter
from tftrt_py.convert.ops.registry import register
from tftrt_py.engine.network import Tensor

__all__ = ["ShapeInfoConverter", "SHAPE_INFO"]

#: TF op -> its value for a concrete input shape
SHAPE_INFO = {
    "Shape": lambda shape: list(shape),
    "ShapeN": lambda shape: list(shape),
    "Size": lambda shape: int(np.prod(shape)),
    "Rank": lambda shape: len(shape),
}


@register(*SHAPE_INFO)
class ShapeInfoConverter(OpConverter):
    """The result is int32 (out_type int64 is refused: the engine has no int64 tensors)."""

    allowed_dtypes = FLOAT_INT_BOOL
    static_outputs = True
    precisions = NO_PRECISION

    def validate(self, node, ctx):
        out = node.attr("out_type", "int32")
        if out != "int32":
            return f"{node.op} with out_type={out} is not supported (supported: int32)"
        return None

    def convert(self, node, ctx):
        values = ctx.inputs(node)
        if node.op != "ShapeN":
            values = values[:1]
        ctx.set_outputs(node, [Weights(np.asarray(SHAPE_INFO[node.op](v.shape), np.int32),
                                       batch_source=v if isinstance(v, Tensor) and v.rank else None)
                               for v in values])
