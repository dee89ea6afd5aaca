"""Tile with multiples known when building: per tiled axis, one Concatenation of copies (exact)."""
import numpy as np

from tftrt_py.convert.ops.base import ANY, FLOAT_INT_BOOL, NO_PRECISION, STATIC, OpConverter
from tftrt_py.convert.ops.registry import register

__all__ = ["TileConverter"]


@register("Tile")
class TileConverter(OpConverter):
    """multiples known when building (a constant or computed from shapes), one per input dim, >= 1."""

    allowed_dtypes = FLOAT_INT_BOOL
    input_spec = (ANY, STATIC)
    precisions = NO_PRECISION

    def validate(self, node, ctx):
        x, multiples = ctx.input_infos(node)
        if multiples.value is None:
            return None
        values = [int(m) for m in np.ravel(multiples.value)]
        if x.rank is not None and len(values) != x.rank:
            return f"Tile needs one multiple per input dim ({x.rank}), got {values}"
        if any(m < 1 for m in values):
            return f"Tile multiples {values} must be >= 1 (empty results are not supported)"
        return None

    def convert(self, node, ctx):
        x, multiples = ctx.inputs(node)
        for axis, m in enumerate(int(m) for m in np.ravel(multiples.value)):
            if m > 1:
                x = ctx.add_layer("Concatenation", [x] * m, {"axis": axis}, node=node, suffix=f"/axis{axis}")[0]
        ctx.set_outputs(node, [x])
