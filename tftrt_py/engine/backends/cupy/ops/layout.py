"""Data-movement layers: Shuffle, Padding, Concatenation, Slice, Gather, Bitcast — strided cupy copies into
the preallocated output (cupy generates and caches the copy kernels)."""
from __future__ import annotations

from typing import List

from tftrt_py.engine.backends.cupy import _device
from tftrt_py.engine.backends.cupy.ops.base import Op, Spec, register
from tftrt_py.engine.layer_geometry import shuffle_shapes

__all__ = ["ShuffleOp", "PaddingOp", "ConcatOp", "SliceOp", "GatherOp", "BitcastOp"]


class ShuffleOp(Op):
    """Transpose, reshape, transpose (a Shuffle that keeps memory order is an alias, not an op)."""

    def __init__(self, spec: Spec):
        p = spec.params
        self.first, self.second = p.get("first_perm"), p.get("second_perm")
        self.mid = None
        if p.get("reshape") is not None:
            self.mid = shuffle_shapes(spec.in_shapes[0], {"first_perm": self.first, "reshape": p["reshape"]})
        self.tactic = {"op": "copy"}

    def run(self, rc, ins, outs):
        cupy = _device.require()
        v = ins[0]
        if self.first is not None:
            v = v.transpose(self.first)
        if self.mid is not None:
            v = v.reshape(self.mid)
        if self.second is not None:
            v = v.transpose(self.second)
        cupy.copyto(outs[0], v)


class PaddingOp(Op):
    def __init__(self, spec: Spec):
        p = spec.params
        self.pads = list(zip(p["pre"], p["post"]))
        self.mode = p.get("mode", "constant")
        self.value = p.get("value", 0)
        self.capturable = self.mode == "constant"
        self.tactic = {"op": "pad_" + self.mode}

    def run(self, rc, ins, outs):
        cupy = _device.require()
        x, y = ins[0], outs[0]
        if self.mode != "constant":
            cupy.copyto(y, cupy.pad(x, self.pads, mode=self.mode))
            return
        y.fill(self.value)
        index = tuple(slice(a, a + d) for (a, _), d in zip(self.pads, x.shape))
        cupy.copyto(y[index], x)


class ConcatOp(Op):
    def __init__(self, spec: Spec):
        rank = len(spec.out_shapes[0])
        self.axis = spec.params["axis"] % rank
        self.bounds, start = [], 0
        for shape in spec.in_shapes:
            self.bounds.append((start, start + shape[self.axis]))
            start += shape[self.axis]
        self.tactic = {"op": "copy"}

    def run(self, rc, ins, outs):
        cupy = _device.require()
        lead = (slice(None),) * self.axis
        for x, (a, b) in zip(ins, self.bounds):
            cupy.copyto(outs[0][lead + (slice(a, b),)], x)


class SliceOp(Op):
    def __init__(self, spec: Spec):
        from tftrt_py.engine.reference import slice_stop as _slice_stop

        p = spec.params
        self.index = tuple(slice(s, _slice_stop(s, n, st), st) for s, n, st in zip(p["start"], p["size"], p["stride"]))
        self.tactic = {"op": "copy"}

    def run(self, rc, ins, outs):
        cupy = _device.require()
        cupy.copyto(outs[0], ins[0][self.index])


class GatherOp(Op):
    def __init__(self, spec: Spec):
        self.axis = spec.params["axis"] % len(spec.in_shapes[0])
        self.tactic = {"op": "take"}

    def run(self, rc, ins, outs):
        cupy = _device.require()
        cupy.take(ins[0], ins[1], axis=self.axis, out=outs[0])


class BitcastOp(Op):
    def __init__(self, spec: Spec):
        self.tactic = {"op": "view"}

    def run(self, rc, ins, outs):
        cupy = _device.require()
        cupy.copyto(outs[0], ins[0].view(outs[0].dtype))


@register("Shuffle")
def shuffle_candidates(spec: Spec) -> List[Op]:
    return [ShuffleOp(spec)]


@register("Padding")
def padding_candidates(spec: Spec) -> List[Op]:
    return [PaddingOp(spec)]


@register("Concatenation")
def concat_candidates(spec: Spec) -> List[Op]:
    return [ConcatOp(spec)]


@register("Slice")
def slice_candidates(spec: Spec) -> List[Op]:
    return [SliceOp(spec)]


@register("Gather")
def gather_candidates(spec: Spec) -> List[Op]:
    return [GatherOp(spec)]


@register("Bitcast")
def bitcast_candidates(spec: Spec) -> List[Op]:
    return [BitcastOp(spec)]
