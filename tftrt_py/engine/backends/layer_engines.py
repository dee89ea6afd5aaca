"""Single layers on whole-engine backends: ``run_layer`` through a cached one-layer engine.

Backends that compile whole engines (cupy, onnxruntime) still answer the per-layer protocol the numpy
backend speaks (``run_layer(layer, inputs)``): each layer gets an engine of its own, built once.
"""
from __future__ import annotations

import os
import threading
from typing import Dict, List

import numpy as np

from tftrt_py.engine.network import Network

__all__ = ["LayerEngines", "single_layer_network", "flag", "strict_types"]


def flag(value) -> bool:
    return str(value).strip().lower() in ("1", "true", "yes", "on")


def strict_types(engine) -> bool:
    """Whether `engine` keeps every quantized layer quantized even where another precision runs faster (TensorRT's
    strict types): its build config's ``strict_types``, else ``TFTRT_PY_STRICT_TYPES``."""
    return flag((engine.build_config or {}).get("strict_types", os.environ.get("TFTRT_PY_STRICT_TYPES", "0")))


def single_layer_network(layer, inputs: List[np.ndarray]) -> Network:
    """A network of `layer` alone, its inputs shaped as `inputs`, its tensors' dynamic ranges kept."""
    net = Network(f"layer {layer.name}")
    ins = [net.add_input(f"input_{i}", np.asarray(a).dtype, np.shape(a)) for i, a in enumerate(inputs)]
    for t, old in zip(ins, layer.inputs):
        t.dynamic_range = old.dynamic_range
    new = net.add_layer(layer.kind, ins, layer.params, layer.weights, name=layer.name)
    new.precision = layer.precision
    for t, old in zip(new.outputs, layer.outputs):
        t.dynamic_range = old.dynamic_range
        net.mark_output(t)
    return net


class LayerEngines:
    """Base of a backend with a ``name``: ``run_layer`` on one-layer engines cached by layer."""

    def __init__(self):
        self._layer_engines: Dict[int, tuple] = {}
        self._layer_lock = threading.Lock()

    def run_layer(self, layer, inputs: List[np.ndarray]) -> List[np.ndarray]:
        """One layer on host arrays (through a cached one-layer engine)."""
        from tftrt_py.engine.runtime import Engine

        with self._layer_lock:
            entry = self._layer_engines.get(id(layer))
            if entry is None or entry[0] is not layer:
                engine = Engine(single_layer_network(layer, inputs), precision=layer.precision or "FP32",
                                backend=self.name)
                entry = (layer, engine.create_execution_context())
                self._layer_engines[id(layer)] = entry
        return entry[1].execute_v2([np.asarray(a) for a in inputs])
