"""TopKV2 with a constant k as one TopK layer (values and int32 indices, largest first)."""
import numpy as np

from tftrt_py.convert.ops.base import ANY, FLOAT_INT, NO_PRECISION, WEIGHT, OpConverter
from tftrt_py.convert.ops.registry import register

__all__ = ["TopKConverter"]


@register("TopKV2")
class TopKConverter(OpConverter):
    """Constant k along the last axis; index_type int32. Always sorted (which sorted=False allows)."""

    allowed_dtypes = FLOAT_INT
    precisions = NO_PRECISION
    input_spec = (ANY, WEIGHT)

    def validate(self, node, ctx):
        index_type = node.attr("index_type", "int32")
        if index_type != "int32":
            return f"TopKV2 with index_type={index_type} is not supported (supported: int32)"
        x, k = ctx.input_infos(node)
        if np.size(k.value) != 1:
            return "TopKV2 needs a scalar k"
        k = int(np.ravel(k.value)[0])
        if x.rank == 0:
            return "TopKV2 needs an input of rank >= 1"
        last = None if x.shape is None else x.shape[-1]
        if k < 0 or (last is not None and k > last):
            return f"TopKV2 k={k} is out of range for a last dim of size {last}"
        return None

    def convert(self, node, ctx):
        x, k = ctx.inputs(node)
        params = {"k": int(np.ravel(k.value)[0]), "axis": len(x.shape) - 1}
        ctx.set_outputs(node, ctx.add_layer("TopK", [x], params, node=node))
