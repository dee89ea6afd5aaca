"""Ops that rearrange whole tensors: Pack (a Shuffle per input, then a Concatenation), ExpandDims and
Transpose (one Shuffle), DepthToSpace and SpaceToDepth (two Shuffles: a reshape and transpose, then a
reshape)."""
import numpy as np

from tftrt_py.convert.ops.base import ANY, EXACT_INT64, NO_PRECISION, WEIGHT, OpConverter
from tftrt_py.convert.ops.conv import LAYOUTS, data_format, from_channels_last, layout_reason, to_channels_last
from tftrt_py.convert.ops.registry import register

__all__ = ["PackConverter", "ExpandDimsConverter", "TransposeConverter", "SpaceDepthConverter", "SPACE_DEPTH"]


def _expand(shape, axis):
    shape = list(shape)
    shape.insert(axis, 1)
    return shape


@register("Pack")
class PackConverter(OpConverter):
    """N same-shaped tensors stacked along a new axis (negative counts from the output's end)."""

    allowed_dtypes = EXACT_INT64
    precisions = NO_PRECISION

    def convert(self, node, ctx):
        values = ctx.inputs(node)
        axis = int(node.attr("axis", 0)) % (len(values[0].shape) + 1)
        params = {"reshape": _expand(values[0].shape, axis)}
        if len(values) == 1:
            ctx.set_outputs(node, ctx.add_layer("Shuffle", values, params, node=node))
            return
        pieces = [ctx.add_layer("Shuffle", [v], params, node=node, suffix=f"/expand{i}")[0]
                  for i, v in enumerate(values)]
        ctx.set_outputs(node, ctx.add_layer("Concatenation", pieces, {"axis": axis}, node=node))


@register("ExpandDims")
class ExpandDimsConverter(OpConverter):
    """A size-1 axis inserted at a constant position (negative counts from the output's end)."""

    allowed_dtypes = EXACT_INT64
    precisions = NO_PRECISION
    input_spec = (ANY, WEIGHT)

    def validate(self, node, ctx):
        return None if np.size(ctx.input_infos(node)[1].value) == 1 else "ExpandDims needs a single axis"

    def convert(self, node, ctx):
        x, axis = ctx.inputs(node)
        axis = int(np.ravel(axis.value)[0]) % (len(x.shape) + 1)
        ctx.set_outputs(node, ctx.add_layer("Shuffle", [x], {"reshape": _expand(x.shape, axis)}, node=node))


@register("Transpose")
class TransposeConverter(OpConverter):
    """A constant permutation as a Shuffle's first transpose."""

    allowed_dtypes = EXACT_INT64
    precisions = NO_PRECISION
    input_spec = (ANY, WEIGHT)

    def validate(self, node, ctx):
        x, perm = ctx.input_infos(node)
        perm = [int(p) for p in np.ravel(perm.value)]
        if x.rank is not None and sorted(p % x.rank for p in perm) != list(range(x.rank)):
            return f"perm {perm} is not a permutation of the input's {x.rank} axes"
        return None

    def convert(self, node, ctx):
        x, perm = ctx.inputs(node)
        perm = [int(p) % len(x.shape) for p in np.ravel(perm.value)]
        ctx.set_outputs(node, ctx.add_layer("Shuffle", [x], {"first_perm": perm}, node=node))


#: TF op -> whether it moves depth into space (DepthToSpace) rather than space into depth
SPACE_DEPTH = {"DepthToSpace": True, "SpaceToDepth": False}


@register(*SPACE_DEPTH)
class SpaceDepthConverter(OpConverter):
    """Block rearrangements of a 4-d NHWC or NCHW tensor (NCHW_VECT_C is refused), done channels-last.

    DepthToSpace: [N, H, W, b*b*C] -> [N, H, W, b, b, C] -> [N, H, b, W, b, C] -> [N, H*b, W*b, C];
    SpaceToDepth is its inverse.
    """

    allowed_dtypes = EXACT_INT64
    precisions = NO_PRECISION

    def validate(self, node, ctx):
        reason = layout_reason(node, attrs=())
        if reason:
            return reason
        x = ctx.input_infos(node)[0]
        b = int(node.attr("block_size"))
        if x.rank is not None and x.rank != 4:
            return f"{node.op} needs a 4-d input, got rank {x.rank}"
        if b < 2:
            return f"{node.op} block_size must be at least 2, got {b}"
        if x.rank == 4:
            axes, channel = LAYOUTS[data_format(node)]
            dims, factor = ([x.shape[channel]], b * b) if SPACE_DEPTH[node.op] else ([x.shape[a] for a in axes], b)
            if any(d is not None and d % factor for d in dims):
                return f"{node.op} with block_size {b} needs dims {dims} divisible by {factor}"
        return None

    def convert(self, node, ctx):
        x = to_channels_last(ctx, node, ctx.inputs(node)[0])
        n, h, w, c = x.shape
        b = int(node.attr("block_size"))
        if SPACE_DEPTH[node.op]:
            first = {"reshape": [n, h, w, b, b, c // (b * b)], "second_perm": [0, 1, 3, 2, 4, 5]}
            final = [n, h * b, w * b, c // (b * b)]
        else:
            first = {"reshape": [n, h // b, b, w // b, b, c], "second_perm": [0, 1, 3, 2, 4, 5]}
            final = [n, h // b, w // b, b * b * c]
        y = ctx.add_layer("Shuffle", [x], first, node=node, suffix="/blocks")[0]
        y = ctx.add_layer("Shuffle", [y], {"reshape": final}, node=node)[0]
        ctx.set_outputs(node, [from_channels_last(ctx, node, y)])
