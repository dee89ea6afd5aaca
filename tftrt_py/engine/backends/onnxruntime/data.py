"""Lowerings of the kinds that move, select or reduce data (Shuffle, Padding, Concatenation, Slice, Gather,
Reduce, ArgReduce, TopK, Resize), with the numpy backend's semantics."""
from __future__ import annotations

from typing import Callable, Dict

import numpy as np

from tftrt_py.engine.reference import linear_weights, nearest_index, slice_stop
from tftrt_py.engine.backends.onnxruntime.graph import Graph, compute_dtype
from tftrt_py.engine.backends.onnxruntime.registry import lowers
from tftrt_py.engine.layer_geometry import shuffle_shapes

__all__ = ["REDUCE"]

#: A Slice end before index 0 when stepping down (ONNX clamps it to -1).
_BEFORE_START = -2 ** 63


@lowers("Shuffle")
def _shuffle(g, layer, ins):
    p, x = layer.params, ins[0]
    if p.get("first_perm") is not None:
        x = g.transpose(x, p["first_perm"])
    if p.get("reshape") is not None:
        x = g.reshape(x, shuffle_shapes(layer.inputs[0].shape, {**p, "second_perm": None}))
    if p.get("second_perm") is not None:
        x = g.transpose(x, p["second_perm"])
    return [g.node("Identity", [x])]


def _mirror(g: Graph, x: str, axis: int, size: int, pre: int, post: int) -> str:
    """numpy's "symmetric" padding of one axis: the edge rows repeated in mirror order."""
    parts = [x]
    if pre:
        parts.insert(0, g.slice(x, [pre - 1], [_BEFORE_START], [axis], [-1]))
    if post:
        end = size - 1 - post
        parts.append(g.slice(x, [size - 1], [end if end >= 0 else _BEFORE_START], [axis], [-1]))
    return g.node("Concat", parts, axis=axis) if len(parts) > 1 else x


@lowers("Padding")
def _padding(g, layer, ins):
    p, t = layer.params, layer.inputs[0]
    mode = p.get("mode", "constant")
    if mode == "symmetric":  # ONNX has reflect (edge excluded), not symmetric (edge included)
        x = ins[0]
        for axis, (size, a, b) in enumerate(zip(t.shape, p["pre"], p["post"])):
            x = _mirror(g, x, axis, size, a, b)
        return [x]
    pads = g.ints(list(p["pre"]) + list(p["post"]))
    if mode == "reflect":
        return [g.node("Pad", [ins[0], pads], mode="reflect")]
    return [g.node("Pad", [ins[0], pads, g.scalar(p.get("value", 0), compute_dtype(t.dtype))])]


@lowers("Concatenation")
def _concat(g, layer, ins):
    return [g.node("Concat", ins, axis=layer.params["axis"])]


@lowers("Slice")
def _slice(g, layer, ins):
    p = layer.params
    ends = [slice_stop(s, n, st) for s, n, st in zip(p["start"], p["size"], p["stride"])]
    ends = [_BEFORE_START if e is None else e for e in ends]
    return [g.slice(ins[0], p["start"], ends, list(range(layer.inputs[0].rank)), p["stride"])]


@lowers("Gather")
def _gather(g, layer, ins):
    return [g.node("Gather", ins, axis=layer.params["axis"])]


def _reduce_op(op: str) -> Callable:
    return lambda g, x, axes, keep: g.node(op, [x, axes], keepdims=keep)


REDUCE: Dict[str, Callable] = {
    **{name: _reduce_op(op) for name, op in (
        ("sum", "ReduceSum"), ("mean", "ReduceMean"), ("max", "ReduceMax"), ("min", "ReduceMin"),
        ("prod", "ReduceProd"), ("l1", "ReduceL1"), ("sum_squares", "ReduceSumSquare"), ("l2", "ReduceL2"),
        ("log_sum", "ReduceLogSum"))},
    # log(sum(exp(x))) as the layers it replaces (overflows to Inf as TF; ReduceLogSumExp shifts by the max)
    "log_sum_exp": lambda g, x, axes, keep: g.node("Log", [g.node("ReduceSum", [g.node("Exp", [x]), axes],
                                                                  keepdims=keep)]),
}


def _with_nan(g: Graph, out: str, x: str, axes: str, keep: int, dtype) -> str:
    """`out` (a max or min over `axes` of `x`) NaN where x has a NaN, as numpy and TF (ONNX Runtime skips it)."""
    nan = g.node("ReduceMax", [g.cast(g.node("IsNaN", [x]), "bool", "int32"), axes], keepdims=keep)
    return g.node("Where", [g.cast(nan, "int32", "bool"), g.scalar(np.nan, dtype), out])


@lowers("Reduce")
def _reduce(g, layer, ins):
    p, t = layer.params, layer.inputs[0]
    dtype = compute_dtype(t.dtype)
    x = ins[0] if p.get("first_perm") is None else g.transpose(ins[0], p["first_perm"])
    if t.dtype == "bool":  # All / Any: min / max of 0 and 1
        x = g.cast(x, "bool", "int32")
    axes, keep = [a % t.rank for a in p["axes"]], int(bool(p.get("keep_dims")))
    if not axes:  # numpy reduces nothing (ONNX would reduce everything): reduce a unit axis put in front
        x, axes, keep = g.node("Unsqueeze", [x, g.ints([0])]), [0], 0
    axes = g.ints(axes)
    out = REDUCE[p["op"]](g, x, axes, keep)
    if p["op"] in ("max", "min") and np.dtype(dtype).kind == "f":
        out = _with_nan(g, out, x, axes, keep, dtype)
    return [g.cast(out, "int32", "bool") if t.dtype == "bool" else out]


@lowers("ArgReduce")
def _argreduce(g, layer, ins):
    """TF's ArgMax/ArgMin: the first extreme among values beyond the dtype's lowest (highest), NaN skipped, 0
    where there is none."""
    p, dtype = layer.params, compute_dtype(layer.inputs[0].dtype)
    axis, x = p["axis"], ins[0]
    if np.dtype(dtype).kind != "f":
        op = "ArgMax" if p["op"] == "max" else "ArgMin"
        return [g.cast(g.node(op, [x], axis=axis, keepdims=0), "int64", "int32")]
    if p["op"] == "min":
        x = g.node("Neg", [x])
    beyond = g.node("Greater", [x, g.scalar(np.finfo(dtype).min, dtype)])
    found = g.node("ArgMax", [g.node("Where", [beyond, x, g.scalar(-np.inf, dtype)])], axis=axis, keepdims=0)
    rank = layer.inputs[0].rank
    any_ = g.node("ReduceMax", [g.cast(beyond, "bool", "int32"), g.ints([axis % rank])], keepdims=0)
    out = g.node("Where", [g.cast(any_, "int32", "bool"), found, g.scalar(0, np.int64)])
    return [g.cast(out, "int64", "int32")]


@lowers("TopK")
def _topk(g, layer, ins):
    values, indices = g.node("TopK", [ins[0], g.ints([layer.params["k"]])], outputs=2, axis=layer.params["axis"],
                             largest=1, sorted=1)
    return [values, g.cast(indices, "int64", "int32")]


#: ONNX Resize's coordinate transformation of TF's bilinear resize, by half_pixel_centers (without align_corners).
_LINEAR_COORDINATES = {True: "half_pixel", False: "asymmetric"}


@lowers("Resize")
def _resize(g, layer, ins):
    """Nearest: gathers of the rows and columns TF's coordinate rules pick (computed here by the numpy kernel's own
    functions). Linear: ONNX Runtime's Resize, one pass over the output (within 2e-6 of TF's values relative to
    their scale: its weights summed in another order), on finite inputs; on inputs holding NaN or an infinity, and
    with align_corners (whose coordinates Resize computes otherwise, up to 3e-5 apart), the gathers of the numpy
    kernel and its lerps in its order, its float32 arithmetic exactly (several passes over tensors of the output's
    size)."""
    p = layer.params
    (h, w), (oh, ow) = layer.inputs[0].shape[1:3], p["sizes"]
    args = (p.get("align_corners", False), p.get("half_pixel_centers", False))

    def take(x, index, axis):
        return g.node("Gather", [x, g.const(index, np.int64)], axis=axis)

    if p["mode"] == "nearest":
        return [take(take(ins[0], nearest_index(h, oh, *args), 1), nearest_index(w, ow, *args), 2)]
    x = g.cast(ins[0], compute_dtype(layer.inputs[0].dtype), "float32")
    y0, y1, ylerp = linear_weights(h, oh, *args)
    x0, x1, xlerp = linear_weights(w, ow, *args)

    def lerps(b):  # TF's: its gathers, then its lerps in its order
        def lerp(u, v, t):
            return b.node("Add", [u, b.node("Mul", [b.node("Sub", [v, u]), b.const(t, np.float32)])])

        def gather(v, index, axis):
            return b.node("Gather", [v, b.const(index, np.int64)], axis=axis)

        rows = [gather(x, y, 1) for y in (y0, y1)]
        top, bottom = (lerp(gather(r, x0, 2), gather(r, x1, 2), xlerp[None, None, :, None]) for r in rows)
        return lerp(top, bottom, ylerp[None, :, None, None])

    if args[0]:
        return [lerps(g)]
    n, c = layer.inputs[0].shape[0], layer.inputs[0].shape[3]
    # NaN where any value is NaN or infinite: TF's lerps turn an infinite neighbour into NaN or an infinity by the
    # order of their terms, which those inputs keep; finite inputs take the one pass
    nonfinite = g.node("IsNaN", [g.node("ReduceSum", [g.node("Mul", [x, g.scalar(0.0, np.float32)])], keepdims=0)])
    return [g.when(nonfinite, lerps, lambda b: b.node(
        "Resize", [x, "", "", b.ints([n, oh, ow, c])], mode="linear",
        coordinate_transformation_mode=_LINEAR_COORDINATES[args[1]]), "float32")]


