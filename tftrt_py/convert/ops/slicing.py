"""Slicing ops as Slice layers (a Shuffle drops shrunk or unpacked axes and adds new ones); ReverseV2 as a Slice
running backwards; Roll and XlaDynamicUpdateSlice (keras.ops.slice_update) as Slices put back together by
Concatenations, so all of them only move entries and are exact in every dtype.

Begin/end/size/stride operands are known when building (constants, or computed from shapes:
``x[:, :tf.shape(y)[1]]``), split sizes and axes are constants, and shapes are concrete while
building, so every mask and negative index resolves statically to a start, size and stride.
"""
import numpy as np

from tftrt_py.convert.ops.base import ANY, EXACT_INT64, NO_PRECISION, STATIC, WEIGHT, OpConverter
from tftrt_py.convert.ops.registry import register

__all__ = ["SliceConverter", "StridedSliceConverter", "SplitConverter", "SplitVConverter", "UnpackConverter",
           "ReverseConverter", "RollConverter", "DynamicUpdateSliceConverter",
           "add_slice", "split_along", "resolve_strided_slice"]


def _ints(value):
    return [int(v) for v in np.ravel(value)]


def add_slice(ctx, node, x, start, size, stride=None, shape=None, suffix=""):
    """x[start : start + size * stride : stride] as a Slice layer, then a Shuffle reshaping it to `shape`
    (dropping shrunk axes, adding new ones) when that differs from `size`. A slice that takes everything
    adds no layer."""
    stride = stride or [1] * len(start)
    if list(size) != list(x.shape) or any(start) or any(s != 1 for s in stride):
        params = {"start": list(start), "size": list(size), "stride": list(stride)}
        x = ctx.add_layer("Slice", [x], params, node=node, suffix=suffix)[0]
    if shape is not None and list(shape) != list(size):
        x = ctx.add_layer("Shuffle", [x], {"reshape": [int(d) for d in shape]}, node=node,
                          suffix=suffix + "/reshape")[0]
    return x


def split_along(ctx, node, x, axis, sizes, squeeze=False):
    """The pieces of `x` of `sizes` along `axis`, each one Slice layer (`squeeze`: drop the axis)."""
    outs, offset = [], 0
    for i, n in enumerate(sizes):
        start, size = [0] * len(x.shape), list(x.shape)
        start[axis], size[axis] = offset, n
        shape = [d for a, d in enumerate(size) if a != axis] if squeeze else None
        outs.append(add_slice(ctx, node, x, start, size, shape=shape, suffix=f"/{i}"))
        offset += n
    return outs


# -- Slice ----------------------------------------------------------------------------------------
@register("Slice")
class SliceConverter(OpConverter):
    """begin and size are known when building; size -1 takes the rest of the dimension."""

    allowed_dtypes = EXACT_INT64
    precisions = NO_PRECISION
    input_spec = (ANY, STATIC, STATIC)

    def validate(self, node, ctx):
        x, begin, size = ctx.input_infos(node)
        if begin.value is None or size.value is None:
            return None  # computed from shapes: checked when building, where the values are known
        begin, size = _ints(begin.value), _ints(size.value)
        if x.rank is not None and not len(begin) == len(size) == x.rank:
            return f"begin {begin} and size {size} must have one entry per input dim ({x.rank})"
        for b, n, d in zip(begin, size, x.shape or ()):
            if b < 0 or n < -1 or (d is not None and b + (d - b if n == -1 else n) > d):
                return f"slice begin {begin} size {size} is out of range for shape {list(x.shape)}"
        return None

    def convert(self, node, ctx):
        x, begin, size = ctx.inputs(node)
        begin = _ints(begin.value)
        size = [d - b if n == -1 else n for b, n, d in zip(begin, _ints(size.value), x.shape)]
        ctx.set_outputs(node, [add_slice(ctx, node, x, begin, size)])


# -- StridedSlice -------------------------------------------------------------------------------
def _entries(rank, n, ellipsis_mask, new_axis_mask):
    """The output dims of a StridedSlice with `n` index entries, as TF expands them: per dim, (the input
    axis or None for a new axis, the index of its begin/end/stride entry or None where an ellipsis --
    explicit, or implied after the last entry -- takes the whole axis)."""
    ellipsis_mask &= (1 << n) - 1
    if bin(ellipsis_mask).count("1") > 1:
        raise ValueError("StridedSlice with more than one ellipsis is not supported")
    if not ellipsis_mask:
        ellipsis_mask, n = 1 << n, n + 1
    dims, axis = [], 0
    for i in range(n):
        if ellipsis_mask >> i & 1:
            later = [j for j in range(i + 1, n) if not new_axis_mask >> j & 1]
            stop = rank - len(later)
            dims += [(a, None) for a in range(axis, stop)]
            axis = max(axis, stop)
        elif new_axis_mask >> i & 1:
            dims.append((None, i))
        else:
            dims.append((axis, i))
            axis += 1
    if axis > rank:
        raise ValueError(f"StridedSlice has {axis} indices for a rank-{rank} input")
    return dims


def _resolve_dim(dim, begin, end, stride, begin_masked, end_masked, shrink):
    """(start, size, stride) of one dim, as TF canonicalizes it (Python slice semantics)."""
    if shrink:
        index = begin + dim if begin < 0 else begin
        if not 0 <= index < dim:
            raise ValueError(f"StridedSlice index {begin} is out of range for a dim of size {dim}")
        return index, 1, 1
    start, stop, step = slice(None if begin_masked else begin, None if end_masked else end, stride).indices(dim)
    return start, len(range(start, stop, step)), step


def resolve_strided_slice(node, shape, begin, end, strides):
    """(start, size, stride, output shape) of a StridedSlice of an input of `shape`: shrunk axes dropped,
    new axes (new_axis_mask) added as dims of 1 (None dims skipped: their entries are None); raises
    ValueError with the reason it cannot convert."""
    if 0 in strides:
        raise ValueError("StridedSlice with a zero stride is not valid")
    masks = {k: int(node.attr(k, 0)) for k in ("begin_mask", "end_mask", "ellipsis_mask", "shrink_axis_mask",
                                               "new_axis_mask")}
    starts, sizes, steps = [0] * len(shape), list(shape), [1] * len(shape)
    out = []
    for axis, i in _entries(len(shape), len(begin), masks["ellipsis_mask"], masks["new_axis_mask"]):
        if axis is None:
            out.append(1)
            continue
        shrink = i is not None and bool(masks["shrink_axis_mask"] >> i & 1)
        if i is not None:
            starts[axis], sizes[axis], steps[axis] = (None, None, None) if shape[axis] is None else _resolve_dim(
                shape[axis], begin[i], end[i], strides[i], masks["begin_mask"] >> i & 1, masks["end_mask"] >> i & 1,
                shrink)
        if not shrink:
            out.append(sizes[axis])
    return starts, sizes, steps, out


@register("StridedSlice")
class StridedSliceConverter(OpConverter):
    """begin/end/strides known when building; begin, end, ellipsis, shrink and new-axis masks."""

    allowed_dtypes = EXACT_INT64
    precisions = NO_PRECISION
    input_spec = (ANY, STATIC)

    def validate(self, node, ctx):
        x, *consts = ctx.input_infos(node)
        if x.rank is None:
            return "StridedSlice needs an input of known rank"
        if any(c.value is None for c in consts):
            return None  # computed from shapes: checked when building, where the values are known
        try:
            resolve_strided_slice(node, x.shape, *(_ints(c.value) for c in consts))
        except ValueError as exc:
            return str(exc)
        return None

    def convert(self, node, ctx):
        x, *consts = ctx.inputs(node)
        start, size, stride, shape = resolve_strided_slice(node, x.shape, *(_ints(c.value) for c in consts))
        ctx.set_outputs(node, [add_slice(ctx, node, x, start, size, stride, shape)])


# -- Split, SplitV, Unpack ----------------------------------------------------------------------
@register("Split")
class SplitConverter(OpConverter):
    """num_split equal pieces along a constant axis."""

    allowed_dtypes = EXACT_INT64
    precisions = NO_PRECISION
    input_spec = (WEIGHT, ANY)
    #: positions of the value, axis and sizes (None: equal pieces) inputs
    value_index, axis_index, sizes_index = 1, 0, None

    def validate(self, node, ctx):
        infos = ctx.input_infos(node)
        shape = infos[self.value_index].shape
        if shape is None:
            return f"{node.op} needs an input of known rank"
        try:
            self.sizes(node, infos, shape[_ints(infos[self.axis_index].value)[0] % len(shape)])
        except ValueError as exc:
            return str(exc)
        return None

    def sizes(self, node, infos, dim):
        """The piece sizes (None while `dim` is unknown); ValueError when there are none."""
        num = int(node.attr("num_split"))
        if dim is not None and dim % num:
            raise ValueError(f"Split of a dim of size {dim} into {num} equal pieces is not possible")
        return None if dim is None else [dim // num] * num

    def convert(self, node, ctx):
        values = ctx.inputs(node)
        x = values[self.value_index]
        axis = _ints(values[self.axis_index].value)[0] % len(x.shape)
        ctx.set_outputs(node, split_along(ctx, node, x, axis, self.sizes(node, ctx.input_infos(node), x.shape[axis])))


@register("SplitV")
class SplitVConverter(SplitConverter):
    """Pieces of constant sizes along a constant axis; one size may be -1 (the rest)."""

    input_spec = (ANY, WEIGHT, WEIGHT)
    value_index, axis_index, sizes_index = 0, 2, 1

    def sizes(self, node, infos, dim):
        num, sizes = int(node.attr("num_split")), _ints(infos[self.sizes_index].value)
        if len(sizes) != num or sizes.count(-1) > 1:
            raise ValueError(f"SplitV size_splits {sizes} must have num_split={num} entries, at most one -1")
        if dim is None:
            return None
        rest = dim - sum(s for s in sizes if s != -1)
        sizes = [rest if s == -1 else s for s in sizes]
        if sum(sizes) != dim or min(sizes) < 0:
            raise ValueError(f"SplitV size_splits {sizes} do not add up to the dim's size {dim}")
        return sizes


@register("Unpack")
class UnpackConverter(OpConverter):
    """num tensors, each x's slice at one index of `axis` with that axis dropped."""

    allowed_dtypes = EXACT_INT64
    precisions = NO_PRECISION

    def convert(self, node, ctx):
        x = ctx.inputs(node)[0]
        axis = int(node.attr("axis", 0)) % len(x.shape)
        ctx.set_outputs(node, split_along(ctx, node, x, axis, [1] * x.shape[axis], squeeze=True))


# -- ReverseV2 ------------------------------------------------------------------------------------
@register("ReverseV2")
class ReverseConverter(OpConverter):
    """Constant axes: one Slice running backwards along each."""

    allowed_dtypes = EXACT_INT64
    precisions = NO_PRECISION
    input_spec = (ANY, WEIGHT)
    needs_rank = True

    def convert(self, node, ctx):
        x, axes = ctx.inputs(node)
        axes = {a % len(x.shape) for a in _ints(axes.value)}
        start = [d - 1 if a in axes else 0 for a, d in enumerate(x.shape)]
        stride = [-1 if a in axes else 1 for a in range(len(x.shape))]
        ctx.set_outputs(node, [add_slice(ctx, node, x, start, list(x.shape), stride)])


# -- Roll -----------------------------------------------------------------------------------------
@register("Roll")
class RollConverter(OpConverter):
    """shift and axis known when building, one shift per axis (an axis named twice rolls by their sum): per rolled
    axis, its last `shift` entries concatenated before the others."""

    allowed_dtypes = EXACT_INT64
    precisions = NO_PRECISION
    input_spec = (ANY, STATIC, STATIC)
    needs_rank = True

    def validate(self, node, ctx):
        x, shift, axis = ctx.input_infos(node)
        if shift.value is None or axis.value is None:
            return None  # computed from shapes: known when building
        axes = _ints(axis.value)
        if any(not -x.rank <= a < x.rank for a in axes):
            return f"Roll axes {axes} are out of range for an input of rank {x.rank}"
        return None

    def convert(self, node, ctx):
        x, shift, axis = ctx.inputs(node)
        rank = len(x.shape)
        shifts = [0] * rank
        for s, a in zip(_ints(shift.value), _ints(axis.value)):
            shifts[a % rank] += s
        for a, s in enumerate(shifts):
            k = s % x.shape[a] if x.shape[a] else 0
            if k:
                tail, head = split_along(ctx, node, x, a, [x.shape[a] - k, k])
                x = ctx.add_layer("Concatenation", [head, tail], {"axis": a}, node=node, suffix=f"/roll{a}")[0]
        ctx.set_outputs(node, [x])


# -- XlaDynamicUpdateSlice ------------------------------------------------------------------------
@register("XlaDynamicUpdateSlice")
class DynamicUpdateSliceConverter(OpConverter):
    """indices known when building, one per input dim, clamped as XLA does so the update (of the input's rank, no
    dim larger than the input's) fits."""

    allowed_dtypes = EXACT_INT64
    precisions = NO_PRECISION
    input_spec = (ANY, ANY, STATIC)
    needs_rank = True

    def validate(self, node, ctx):
        x, update, indices = ctx.input_infos(node)
        if update.rank != x.rank or any(u is not None and d is not None and u > d
                                        for u, d in zip(update.shape, x.shape)):
            return f"XlaDynamicUpdateSlice of an update of shape {list(update.shape)} into {list(x.shape)}"
        if indices.value is not None and len(_ints(indices.value)) != x.rank:
            return f"XlaDynamicUpdateSlice needs one index per input dim ({x.rank}), got {_ints(indices.value)}"
        return None

    def convert(self, node, ctx):
        x, update, indices = ctx.inputs(node)
        if 0 in update.shape:  # writes nothing
            ctx.set_outputs(node, [x])
            return
        starts = [min(max(i, 0), d - u) for i, d, u in zip(_ints(indices.value), x.shape, update.shape)]
        ctx.set_outputs(node, [self._written(ctx, node, x, update, starts, 0)])

    def _written(self, ctx, node, x, update, starts, axis):
        """`x` with `update` written at `starts` along the axes from `axis` on (along the earlier ones `x` spans
        the update's extent already)."""
        if axis == len(starts):
            return update
        start, size, dim = starts[axis], update.shape[axis], x.shape[axis]
        pieces = []
        for begin, n in ((0, start), (start, size), (start + size, dim - start - size)):
            if n:
                begins, sizes = [0] * len(starts), list(x.shape)
                begins[axis], sizes[axis] = begin, n
                pieces.append(add_slice(ctx, node, x, begins, sizes, suffix=f"/axis{axis}_{begin}"))
        within = start > 0
        pieces[within] = self._written(ctx, node, pieces[within], update, starts, axis + 1)
        if len(pieces) == 1:
            return pieces[0]
        return ctx.add_layer("Concatenation", pieces, {"axis": axis}, node=node, suffix=f"/axis{axis}")[0]
