"""TopK (a stable device sort) and NMS (the numpy reference on the host): both synchronize with the
host, so they run between captured CUDA graphs."""
from __future__ import annotations

from typing import List

import numpy as np

from tftrt_py.engine.backends.cupy import _device
from tftrt_py.engine.backends.cupy.ops.base import Op, Spec, register

__all__ = ["TopKOp", "HostOp"]


class TopKOp(Op):
    capturable = False

    def __init__(self, spec: Spec):
        self.axis = spec.params["axis"] % len(spec.in_shapes[0])
        self.k = spec.params["k"]
        self.tactic = {"op": "stable_argsort"}

    def run(self, rc, ins, outs):
        cupy = _device.require()
        x = ins[0]
        order = cupy.argsort(-x.astype(cupy.float32), axis=self.axis)
        idx = cupy.take(order, cupy.arange(self.k), axis=self.axis)
        cupy.copyto(outs[0], cupy.take_along_axis(x, idx, axis=self.axis))
        cupy.copyto(outs[1], idx, casting="unsafe")


class HostOp(Op):
    """Runs the numpy backend's kernel on host copies (float inputs widened to float32)."""

    capturable = False

    def __init__(self, spec: Spec):
        from tftrt_py.engine.reference import KERNELS

        self.layer, self.fn = spec.layer, KERNELS[spec.layer.kind]
        self.tactic = {"op": "host_numpy"}

    def run(self, rc, ins, outs):
        host = []
        for x in ins:
            a = x.get(stream=rc.stream)
            host.append(a.astype(np.float32) if a.dtype == np.float16 else a)
        results = self.fn(self.layer, host)
        for y, r in zip(outs, results):
            y.set(np.ascontiguousarray(np.asarray(r).astype(y.dtype)), stream=rc.stream)


@register("TopK")
def topk_candidates(spec: Spec) -> List[Op]:
    return [TopKOp(spec)]


@register("NMS")
def nms_candidates(spec: Spec) -> List[Op]:
    return [HostOp(spec)]
