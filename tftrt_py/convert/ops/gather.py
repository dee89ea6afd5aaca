"""GatherV2 along a constant axis (batch_dims 0) as one Gather layer.

The indices may be a tensor (int32, the engine's only index type) or a constant of either
index type; params may be a constant too (an embedding table looked up by tensor indices).
"""
import numpy as np

from tftrt_py.convert.context import Weights
from tftrt_py.convert.ops.base import ANY, FLOAT_INT_BOOL, NO_PRECISION, WEIGHT, OpConverter
from tftrt_py.convert.ops.registry import register

__all__ = ["GatherConverter"]


@register("GatherV2")
class GatherConverter(OpConverter):
    """Constant axis, batch_dims 0; tensor indices must be int32."""

    allowed_dtypes = FLOAT_INT_BOOL
    precisions = NO_PRECISION
    dtype_attr = "Tparams"
    input_spec = (ANY, ANY, WEIGHT)

    def validate(self, node, ctx):
        batch_dims = node.attr("batch_dims", 0)
        if batch_dims != 0:
            return f"GatherV2 with batch_dims={batch_dims} is not supported (supported: 0)"
        params, indices, axis = ctx.input_infos(node)
        if indices.value is None and indices.dtype != "int32":
            return f"GatherV2 with {indices.dtype} tensor indices is not supported (tensor indices must be int32)"
        if np.size(axis.value) != 1:
            return "GatherV2 needs a single axis"
        return None

    def convert(self, node, ctx):
        params, indices, axis = ctx.inputs(node)
        axis = int(np.ravel(axis.value)[0]) % len(params.shape)
        if not isinstance(indices, Weights):
            ctx.set_outputs(node, ctx.add_layer("Gather", [params, indices], {"axis": axis}, node=node))
            return
        # Constant indices gather as int32 with rank >= 1 (the engine's Constant layers have no 0-d
        # values); a scalar index's axis is then dropped by a reshape. Both fold, keeping how the
        # indices depend on the batch.
        scalar = not indices.rank
        if indices.dtype != "int32":
            indices = ctx.add_layer("Identity", [indices], {"dtype": "int32"}, node=node, suffix="/indices")[0]
        if scalar:
            indices = ctx.add_layer("Shuffle", [indices], {"reshape": [1]}, node=node, suffix="/index")[0]
        y = ctx.add_layer("Gather", [params, indices], {"axis": axis}, node=node, suffix="/gather" if scalar else "")[0]
        if scalar:
            y = ctx.add_layer("Shuffle", [y], {"reshape": [d for i, d in enumerate(params.shape) if i != axis]},
                              node=node)[0]
        ctx.set_outputs(node, [y])
