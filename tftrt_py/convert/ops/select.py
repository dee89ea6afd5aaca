"""Select and SelectV2 as one Select layer (np.where), whose operands broadcast like numpy's."""
from tftrt_py.convert.ops.base import FLOAT_INT_BOOL, NO_PRECISION, OpConverter
from tftrt_py.convert.ops.registry import register

__all__ = ["SelectConverter"]


@register("Select", "SelectV2")
class SelectConverter(OpConverter):
    """SelectV2 broadcasts; Select's condition is the operands' shape, or a vector picking rows."""

    allowed_dtypes = FLOAT_INT_BOOL
    precisions = NO_PRECISION

    def validate(self, node, ctx):
        cond, x, _ = ctx.input_infos(node)
        if node.op == "Select" and (cond.rank is None or x.rank is None):
            return "Select needs the ranks of its condition and operands"
        return None

    def convert(self, node, ctx):
        cond, x, y = ctx.inputs(node)
        if node.op == "Select" and len(cond.shape) == 1 and len(x.shape) > 1:  # one condition per row
            params = {"reshape": [cond.shape[0]] + [1] * (len(x.shape) - 1)}
            cond = ctx.add_layer("Shuffle", [cond], params, node=node, suffix="/rows")[0]
        ctx.set_outputs(node, ctx.add_layer("Select", [cond, x, y], node=node))
