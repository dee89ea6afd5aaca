"""The numpy backend: the reference kernels (:mod:`tftrt_py.engine.reference`) run layer by layer on the host.

Layers the builder set to FP16, INT8 or FP8 run through :mod:`numpy_precision`, which computes them as the GPU
does.
"""
from __future__ import annotations

import threading
import time
from typing import AbstractSet, Dict, List, Mapping, Optional

import numpy as np

from tftrt_py.engine.backends import numpy_precision
from tftrt_py.engine.backends.base import Allocate, Backend, Runner, deliver
from tftrt_py.engine.backends.threads import blas_limit
from tftrt_py.engine.errors import BackendError, RuntimeExecutionError
from tftrt_py.engine.reference import KERNELS

__all__ = ["NumpyBackend", "NumpyRunner", "LayerStep"]


class NumpyRunner(Runner):
    """Interprets an engine layer by layer on host arrays, through the context's backend (``ctx.backend``),
    dropping each tensor after its last reader."""

    def __init__(self, engine):
        self.engine = engine
        self._lock = threading.Lock()
        self._last_use: Dict[str, int] = {}
        for i, layer in enumerate(engine.network.layers):
            for t in layer.inputs:
                self._last_use[t.name] = i
        for t in engine.network.outputs:
            self._last_use[t.name] = len(engine.network.layers)

    def execute(self, ctx, bindings: Mapping[str, np.ndarray], outputs: Optional[Allocate] = None
                ) -> Dict[str, np.ndarray]:
        eng = self.engine
        with self._lock, blas_limit():  # BLAS spawns no more threads than the process allows
            values, batch = ctx._check_inputs(bindings)
            for i, layer in enumerate(eng.network.layers):
                args = [values[t.name] for t in layer.inputs]
                start = time.perf_counter() if ctx.profiler else 0.0
                try:
                    results = ctx.backend.run_layer(layer, args)
                except RuntimeExecutionError:
                    raise
                except Exception as exc:
                    raise RuntimeExecutionError(f"layer {layer.name!r} ({layer.kind}) failed: {exc}") from exc
                if ctx.profiler:
                    ctx.profiler.report_layer_time(layer.name, (time.perf_counter() - start) * 1e3)
                for t, r in zip(layer.outputs, results):
                    values[t.name] = r
                for t in layer.inputs:
                    if self._last_use.get(t.name) == i:
                        values.pop(t.name, None)
            outs = {}
            for i, t in enumerate(eng.outputs):
                out = values[t.name]
                if batch is not None and eng.rowwise and batch < eng.max_batch_size:
                    out = out[:batch]
                outs[t.name] = deliver(out, i, outputs, copy=ctx.padded_view(out))
            return outs


class LayerStep:
    """One layer the numpy kernels run, as a step of a program: reads its inputs from `values` (tensor name ->
    array) and writes its outputs there."""

    def __init__(self, layer):
        self.layer, self.layers, self.backend = layer, [layer], NumpyBackend()

    def run(self, values: Dict[str, np.ndarray]) -> None:
        outs = self.backend.run_layer(self.layer, [values[t.name] for t in self.layer.inputs])
        for t, out in zip(self.layer.outputs, outs):
            values[t.name] = out


class NumpyBackend(Backend):
    """Runs layers with numpy on the host, with IEEE semantics and no warnings: NaN and Inf propagate as in TF."""

    name = "numpy"

    @property
    def kinds(self) -> AbstractSet[str]:
        return KERNELS.keys()

    def create_runner(self, engine) -> NumpyRunner:
        return NumpyRunner(engine)

    def recording_steps(self, network) -> List[LayerStep]:
        """Steps computing every tensor of `network` as it stands, each leaving the tensors it computes in the
        values it runs on (see calibration.collector.CalibrationEngine): one layer each."""
        return [LayerStep(layer) for layer in network.layers]

    def run_layer(self, layer, inputs: List[np.ndarray]) -> List[np.ndarray]:
        """Outputs of one layer on host arrays."""
        fn = KERNELS.get(layer.kind)
        if fn is None:
            raise BackendError(f"don't know how to run layer kind {layer.kind!r} on backend 'numpy'")
        with np.errstate(all="ignore"):
            if layer.precision in ("FP16", "INT8", "FP8"):  # computed as the GPU computes them
                return numpy_precision.run(fn, layer, inputs)
            return fn(layer, inputs)
