"""OneHot: the indices, with a size-1 dim where the classes go, compared (ElementWise equal) with the class numbers
0..depth-1 laid along that dim, then a Select of on_value and off_value; exact in every dtype. Indices outside
[0, depth) match no class and give off_value everywhere, as in TF. The mixture-of-experts routers of keras-hub
(Mixtral) pick their experts with it."""
import numpy as np

from tftrt_py.convert.ops.base import ANY, EXACT_INT64, NO_PRECISION, WEIGHT, OpConverter
from tftrt_py.convert.ops.registry import register
from tftrt_py.convert.values import Weights

__all__ = ["OneHotConverter"]

#: Index dtypes OneHot takes here (TF also takes uint8).
INDEX_DTYPES = ("int32", "int64")


@register("OneHot")
class OneHotConverter(OpConverter):
    """int32 or int64 indices of known rank; depth, on_value and off_value constant scalars."""

    allowed_dtypes = EXACT_INT64
    input_spec = (ANY, WEIGHT, WEIGHT, WEIGHT)
    needs_rank = True
    precisions = NO_PRECISION

    def validate(self, node, ctx):
        indices, depth, on, off = ctx.input_infos(node)
        if indices.dtype not in INDEX_DTYPES:
            return f"OneHot with {indices.dtype} indices is not supported (supported: {', '.join(INDEX_DTYPES)})"
        if np.size(depth.value) != 1 or int(np.ravel(depth.value)[0]) < 1:
            return f"OneHot depth {np.ravel(depth.value).tolist()} must be one value >= 1"
        if np.size(on.value) != 1 or np.size(off.value) != 1:
            return "OneHot on_value and off_value must be scalars"
        axis = node.attr("axis", -1)
        if not -1 <= axis <= indices.rank:
            return f"OneHot axis {axis} is out of range for indices of rank {indices.rank}"
        return None

    def convert(self, node, ctx):
        indices, depth, on, off = ctx.inputs(node)
        depth = int(np.ravel(depth.value)[0])
        rank = len(indices.shape) + 1
        axis = node.attr("axis", -1) % rank
        spread = list(indices.shape[:axis]) + [1] + list(indices.shape[axis:])
        along = [depth if i == axis else 1 for i in range(rank)]
        x = ctx.add_layer("Shuffle", [indices], {"reshape": spread}, node=node, suffix="/expand")[0]
        classes = Weights(np.arange(depth, dtype=indices.dtype).reshape(along))
        hot = ctx.add_layer("ElementWise", [x, classes], {"op": "equal"}, node=node, suffix="/equal")[0]
        dtype = node.attr("T")
        values = [Weights(np.asarray(v.value, dtype).reshape([1] * rank)) for v in (on, off)]
        ctx.set_outputs(node, ctx.add_layer("Select", [hot, *values], node=node))
