"""Select and SelectV2 as one Select layer (np.where), whose operands broadcast like numpy's;
MatrixBandPart as a Select between x and 0 with a constant band mask (exact)."""
import numpy as np

from tftrt_py.convert.errors import InvalidNodeError
from tftrt_py.convert.ops.base import ANY, EXACT_INT64, NO_PRECISION, STATIC, OpConverter
from tftrt_py.convert.ops.registry import register
from tftrt_py.convert.values import Weights

__all__ = ["SelectConverter", "BandPartConverter"]


@register("Select", "SelectV2")
class SelectConverter(OpConverter):
    """SelectV2 broadcasts; Select's condition is the operands' shape, or a vector picking rows."""

    allowed_dtypes = EXACT_INT64
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


def _band_mask(rows: int, cols: int, lower: int, upper: int) -> np.ndarray:
    """[rows, cols] bool: True within `lower` diagonals below and `upper` above the main one (negative: all)."""
    i, j = np.arange(rows)[:, None], np.arange(cols)[None, :]
    return ((lower < 0) | (i - j <= lower)) & ((upper < 0) | (j - i <= upper))


@register("MatrixBandPart")
class BandPartConverter(OpConverter):
    """tf.linalg.band_part: num_lower and num_upper known when building; an input of rank >= 2."""

    allowed_dtypes = EXACT_INT64
    input_spec = (ANY, STATIC)
    needs_rank = True
    precisions = NO_PRECISION

    def validate(self, node, ctx):
        x, lower, upper = ctx.input_infos(node)
        if x.rank < 2:
            return f"MatrixBandPart needs an input of rank >= 2, got rank {x.rank}"
        if lower.value is None or upper.value is None:
            return None
        return _band_reason(x.shape[-2:], int(lower.value), int(upper.value))

    def convert(self, node, ctx):
        x, lower, upper = ctx.inputs(node)
        rows, cols = x.shape[-2:]
        lower, upper = int(lower.value), int(upper.value)
        reason = _band_reason((rows, cols), lower, upper)  # bounds computed from shapes are known only now
        if reason is not None:
            raise InvalidNodeError(reason, node)
        mask = _band_mask(rows, cols, lower, upper)
        if mask.all():  # the whole matrix
            ctx.set_outputs(node, [x])
            return
        zero = Weights(np.zeros((), x.dtype))
        ctx.set_outputs(node, ctx.add_layer("Select", [Weights(mask), x, zero], node=node))


def _band_reason(matrix, lower, upper):
    """Why TF's MatrixBandPart rejects these bounds for [rows, cols] matrices (it raises), or None."""
    rows, cols = matrix
    if (rows is not None and lower > rows) or (cols is not None and upper > cols):
        return f"MatrixBandPart bounds ({lower}, {upper}) exceed the {rows}x{cols} matrices"
    return None
