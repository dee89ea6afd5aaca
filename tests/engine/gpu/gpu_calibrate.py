"""Quick INT8 calibration for GPU tests and benchmarks: run the FP32 network on a few batches with
every float tensor marked as an output and keep each tensor's max |value| as its dynamic range."""
from __future__ import annotations

from typing import Callable, Dict, Iterable

import numpy as np

from tftrt_py.engine import Engine, Network

FLOATS = ("float32", "float16")


def _tensors(net: Network):
    return list(net.inputs) + [t for layer in net.layers if layer.kind != "Constant" for t in layer.outputs]


def max_abs_ranges(build: Callable[[], Network], batches: Iterable[Dict[str, np.ndarray]],
                   backend: str = "numpy") -> Dict[str, float]:
    """tensor name -> max |value| over `batches` (input dicts), the FP32 network run on `backend`."""
    net = build()
    outputs = {t.name for t in net.outputs}
    for layer in list(net.layers):
        if layer.kind == "Constant":
            continue
        for t in layer.outputs:
            if t.dtype in FLOATS and t.name not in outputs:
                net.mark_output(t)
    ctx = Engine(net, precision="FP32", backend=backend).create_execution_context()
    ranges: Dict[str, float] = {}
    for inputs in batches:
        values = dict(inputs)
        for name, value in ctx.execute(inputs).items():
            values[name] = value
        for name, value in values.items():
            if hasattr(value, "get") and not isinstance(value, np.ndarray):  # cupy
                value = value.get()
            if np.asarray(value).dtype.name in FLOATS:
                ranges[name] = max(ranges.get(name, 0.0), float(np.max(np.abs(value))))
    return ranges


def apply_ranges(net: Network, ranges: Dict[str, float]) -> Network:
    """Set the dynamic range of every tensor of `net` named in `ranges`; returns `net`."""
    for t in _tensors(net):
        if t.name in ranges:
            t.dynamic_range = ranges[t.name]
    return net
