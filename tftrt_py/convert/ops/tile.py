"""Tile and BroadcastTo with multiples or shape known when building; both exact.

Tile: per tiled axis, one Concatenation of copies. BroadcastTo: one Select whose constant all-true
condition spans the broadcast dims only (size 1 elsewhere), so the layer reads x and broadcasts it.
Repeating one row tf.shape(t)[0] times (Tile or BroadcastTo) gives rows of t's batch: the condition
follows that batch and the engine stays row-wise; a batch anywhere else pins the engine to it.
"""
import numpy as np

from tftrt_py.convert.errors import InvalidNodeError
from tftrt_py.convert.ops.base import ANY, EXACT_INT64, NO_PRECISION, STATIC, OpConverter
from tftrt_py.convert.ops.registry import register
from tftrt_py.convert.values import Weights

__all__ = ["TileConverter", "BroadcastToConverter"]


@register("Tile")
class TileConverter(OpConverter):
    """multiples known when building (a constant or computed from shapes), one per input dim, >= 1."""

    allowed_dtypes = EXACT_INT64
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
        counts = [int(m) for m in np.ravel(multiples.value)]
        first = np.arange(len(counts)) == 0
        along_batch = Weights.sized(np.ones([m if f else 1 for m, f in zip(counts, first)], np.bool_), multiples,
                                    used=first)
        rows = along_batch.rows and x.shape[0] == 1 and not multiples.depends()[1:].any()
        for axis, m in enumerate(counts[1:] if rows else counts, start=int(rows)):
            if m > 1:
                x = ctx.add_layer("Concatenation", [x] * m, {"axis": axis}, node=node, suffix=f"/axis{axis}")[0]
        if rows:  # one row repeated along the batch: broadcast it, row by row
            x = ctx.add_layer("Select", [along_batch, x, x], node=node)[0]
        elif multiples.batch_source is not None:  # the result's shape holds the batch otherwise
            pin = Weights(np.ones([1] * len(counts), np.bool_), multiples.batch_source)
            x = ctx.add_layer("Select", [pin, x, x], node=node, suffix="/batch_pin")[0]
        ctx.set_outputs(node, [x])


@register("BroadcastTo")
class BroadcastToConverter(OpConverter):
    """shape known when building (a constant or computed from shapes); each input dim 1 or the shape's."""

    allowed_dtypes = EXACT_INT64
    input_spec = (ANY, STATIC)
    precisions = NO_PRECISION

    def validate(self, node, ctx):
        x, shape = ctx.input_infos(node)
        if shape.value is None or x.shape is None:
            return None
        return _broadcast_reason(x.shape, [int(d) for d in np.ravel(shape.value)])

    def convert(self, node, ctx):
        x, shape = ctx.inputs(node)
        target = [int(d) for d in np.ravel(shape.value)]
        reason = _broadcast_reason(x.shape, target)  # a shape computed from shapes is known only now
        if reason is not None:
            raise InvalidNodeError(reason, node)
        if list(x.shape) == target:
            ctx.set_outputs(node, [x])
            return
        dims = [1] * (len(target) - len(x.shape)) + list(x.shape)
        span = [t if d == 1 else 1 for d, t in zip(dims, target)]
        # only the dims taken from `shape` carry its batch: rows when that is dim 0 alone
        true = Weights.sized(np.ones(span, np.bool_), shape, used=[d == 1 for d in dims])
        ctx.set_outputs(node, ctx.add_layer("Select", [true, x, x], node=node))


def _broadcast_reason(shape, target):
    """Why `shape` (None for unknown dims) does not broadcast to `target` as BroadcastTo needs, or None."""
    if len(shape) > len(target) or any(d not in (None, 1, t) for d, t in zip(shape[::-1], target[::-1])):
        return f"BroadcastTo cannot broadcast shape {list(shape)} to {target}"
    if any(t < 1 for t in target):
        return f"BroadcastTo to {target} is not supported (empty results)"
    return None
