"""GatherV2 along a constant axis as one Gather layer.

The indices may be a tensor (int32 or int64) or a constant; params may be a constant too (an embedding table
looked up by tensor indices). With batch_dims = axis = d (per-row lookups, ``take_along_axis``), the first d
dims of params and the gathered axis flatten into one, and each row's indices are offset by the row's start.
"""
import numpy as np

from tftrt_py.convert.ops.base import ANY, EXACT_INT64, NO_PRECISION, WEIGHT, OpConverter
from tftrt_py.convert.ops.registry import register
from tftrt_py.convert.values import Weights

__all__ = ["GatherConverter"]


@register("GatherV2")
class GatherConverter(OpConverter):
    """Constant axis; batch_dims 0, or equal to the axis."""

    allowed_dtypes = EXACT_INT64
    precisions = NO_PRECISION
    dtype_attr = "Tparams"
    input_spec = (ANY, ANY, WEIGHT)

    def validate(self, node, ctx):
        params, indices, axis = ctx.input_infos(node)
        if np.size(axis.value) != 1:
            return "GatherV2 needs a single axis"
        batch_dims = node.attr("batch_dims", 0)
        if batch_dims == 0:
            return None
        if params.rank is None or indices.rank is None:
            return "GatherV2 with batch_dims needs operands of known rank"
        if batch_dims % indices.rank != int(np.ravel(axis.value)[0]) % params.rank:
            return f"GatherV2 with batch_dims={batch_dims} is supported only along axis {batch_dims}"
        return None

    def convert(self, node, ctx):
        params, indices, axis = ctx.inputs(node)
        axis = int(np.ravel(axis.value)[0]) % len(params.shape)
        if node.attr("batch_dims", 0):
            params, indices = _flatten_batch(ctx, node, params, indices, axis)
            axis = 0
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


def _flatten_batch(ctx, node, params, indices, axis):
    """params [*B, N, *rest] and indices [*B, *I] (batch_dims = axis = len(B)) as [prod(B) * N, *rest] and the
    indices into it: each row's indices plus the row's flat position times N."""
    batch, n = params.shape[:axis], params.shape[axis]
    rows = int(np.prod(batch))
    flat = ctx.add_layer("Shuffle", [params], {"reshape": [rows * n, *params.shape[axis + 1:]]}, node=node,
                         suffix="/flat_params")[0]
    starts = Weights((np.arange(rows) * n).reshape(*batch, *[1] * (len(indices.shape) - axis)).astype(indices.dtype))
    return flat, ctx.add_layer("ElementWise", [indices, starts], {"op": "sum"}, node=node, suffix="/flat_indices")[0]
