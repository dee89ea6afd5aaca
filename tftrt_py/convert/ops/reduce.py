"""Reductions over constant axes (negative allowed), with keep_dims: one Reduce layer each."""
import numpy as np

from tftrt_py.convert.ops.base import ANY, FLOAT_INT, WEIGHT, OpConverter
from tftrt_py.convert.ops.registry import register

__all__ = ["ReduceConverter", "REDUCE"]

#: TF op -> Reduce op
REDUCE = {"Sum": "sum", "Mean": "mean", "Max": "max", "Min": "min", "Prod": "prod"}


@register(*REDUCE)
class ReduceConverter(OpConverter):
    allowed_dtypes = FLOAT_INT
    input_spec = (ANY, WEIGHT)

    def convert(self, node, ctx):
        x, axes = ctx.inputs(node)
        params = {"op": REDUCE[node.op], "axes": [int(a) % len(x.shape) for a in np.ravel(axes.value)],
                  "keep_dims": bool(node.attr("keep_dims"))}
        ctx.set_outputs(node, ctx.add_layer("Reduce", [x], params, node=node))
