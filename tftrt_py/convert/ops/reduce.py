"""Reductions over constant axes (negative allowed), with keep_dims: one Reduce layer each."""
import numpy as np

from tftrt_py.convert.ops.base import ANY, BOOL, FLOAT_INT, NO_PRECISION, WEIGHT, OpConverter
from tftrt_py.convert.ops.registry import register

__all__ = ["ReduceConverter", "BoolReduceConverter", "REDUCE", "BOOLEAN"]

#: TF op -> Reduce op (All and Any: the min and max of bools)
REDUCE = {"Sum": "sum", "Mean": "mean", "Max": "max", "Min": "min", "Prod": "prod", "All": "min", "Any": "max"}
#: ops of REDUCE over bools, by the op's definition
BOOLEAN = ("All", "Any")


@register(*(op for op in REDUCE if op not in BOOLEAN))
class ReduceConverter(OpConverter):
    allowed_dtypes = FLOAT_INT
    input_spec = (ANY, WEIGHT)

    def convert(self, node, ctx):
        x, axes = ctx.inputs(node)
        params = {"op": REDUCE[node.op], "axes": [int(a) % len(x.shape) for a in np.ravel(axes.value)],
                  "keep_dims": bool(node.attr("keep_dims"))}
        ctx.set_outputs(node, ctx.add_layer("Reduce", [x], params, node=node))


@register(*BOOLEAN)
class BoolReduceConverter(ReduceConverter):
    """reduce_all and reduce_any over constant axes (negative allowed), with keep_dims: a Reduce min or max."""

    allowed_dtypes = BOOL  # fixed by the op: no dtype attribute to check
    dtype_attr = None
    precisions = NO_PRECISION
