"""ArgMax and ArgMin over a constant (possibly negative) axis: one ArgReduce layer each."""
import numpy as np

from tftrt_py.convert.ops.base import ANY, FLOAT_INT, NO_PRECISION, WEIGHT, OpConverter
from tftrt_py.convert.ops.registry import register

__all__ = ["ArgReduceConverter", "ARG_REDUCE"]

#: TF op -> ArgReduce op
ARG_REDUCE = {"ArgMax": "max", "ArgMin": "min"}


@register(*ARG_REDUCE)
class ArgReduceConverter(OpConverter):
    """Constant axis; output_type must be int32 (TF's default int64 has no engine tensors)."""

    allowed_dtypes = FLOAT_INT
    precisions = NO_PRECISION
    input_spec = (ANY, WEIGHT)

    def validate(self, node, ctx):
        out = node.attr("output_type", "int64")
        if out != "int32":
            return f"{node.op} with output_type={out} is not supported (supported: int32)"
        if np.size(ctx.input_infos(node)[1].value) != 1:
            return f"{node.op} needs a single axis"
        return None

    def convert(self, node, ctx):
        x, axis = ctx.inputs(node)
        params = {"op": ARG_REDUCE[node.op], "axis": int(np.ravel(axis.value)[0]) % len(x.shape)}
        ctx.set_outputs(node, ctx.add_layer("ArgReduce", [x], params, node=node))
