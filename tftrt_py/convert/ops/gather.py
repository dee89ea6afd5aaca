"""GatherV2 along a constant axis (batch_dims 0) as one Gather layer.

The indices may be a tensor (int32, the engine's only index type) or a constant of either
index type; params may be a constant too (an embedding table looked up by tensor indices).
"""
import numpy as np

from tftrt_py.convert.context import Weights
from tftrt_py.convert.ops.base import ANY, FLOAT_INT_BOOL, WEIGHT, OpConverter
from tftrt_py.convert.ops.registry import register

__all__ = ["GatherConverter"]


@register("GatherV2")
class GatherConverter(OpConverter):
    allowed_dtypes = FLOAT_INT_BOOL
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
        if isinstance(indices, Weights):
            indices = Weights(indices.value.astype(np.int32))
        layer_params = {"axis": int(np.ravel(axis.value)[0]) % len(params.shape)}
        ctx.set_outputs(node, ctx.add_layer("Gather", [params, indices], layer_params, node=node))
