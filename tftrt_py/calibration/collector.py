"""Collecting calibration statistics: what an engine op runs while it calibrates.

A :class:`CalibrationEngine` is the op's network in FP32, before fusion (only constants are folded), so
every tensor a later INT8 build may need a range for exists and keeps the name it will have there. It
runs on the numpy backend and hands each float tensor's values to a :class:`Collector`, which keeps one
histogram per tensor and turns them into a calibration table with its calibrator.
"""
from __future__ import annotations

import collections
import concurrent.futures
import logging
import threading
from typing import Dict, List, Sequence

import numpy as np

from tftrt_py.calibration.calibrators import Histogram, get_calibrator
from tftrt_py.calibration.table import CalibrationTable
from tftrt_py.engine.backends.numpy_backend import NumpyBackend
from tftrt_py.engine.builder.passes import eliminate_dead_layers, fold_constants
from tftrt_py.engine.network import Network

__all__ = ["Collector", "CalibrationEngine"]

logger = logging.getLogger(__name__)

FLOATS = ("float32", "float16")


class Collector:
    """Histograms of every float tensor an op's calibration engines computed, over all calibration batches.

    Binning a tensor takes about as long as computing it, so it runs in a thread of its own while the engine
    computes the next layers (whose BLAS calls let it run): tensors are binned one at a time in the order they
    were observed (a histogram's counts depend on the order its range grew in), at most MAX_PENDING waiting.
    """

    #: Tensors observed but not yet binned, at most: each holds its memory until it is.
    MAX_PENDING = 4

    def __init__(self, algorithm: str = "entropy"):
        self.calibrator = get_calibrator(algorithm)
        self.histograms: Dict[str, Histogram] = {}
        self.batches = 0
        self.shapes: List[tuple] = []  # distinct input shapes seen, in arrival order
        self._lock = threading.Lock()
        self._binning = concurrent.futures.ThreadPoolExecutor(1, "tftrt-calibration-binning")
        self._pending: collections.deque = collections.deque()  # futures of binnings, oldest first
        self._pending_lock = threading.Lock()

    def observe(self, name: str, value: np.ndarray) -> None:
        """Bin `value` into the histogram of tensor `name` (in the binning thread; a failure is raised by a later
        observe or by :meth:`ranges`)."""
        if value.dtype.name not in FLOATS:
            return
        with self._pending_lock:
            while len(self._pending) >= self.MAX_PENDING:
                self._pending.popleft().result()
            self._pending.append(self._binning.submit(self._add, name, value))

    def _add(self, name: str, value: np.ndarray) -> None:
        with self._lock:
            histogram = self.histograms.setdefault(name, Histogram(binned=self.calibrator.binned))
        histogram.add(value)

    def _flush(self) -> None:
        """Wait until every observed tensor is binned."""
        with self._pending_lock:
            while self._pending:
                self._pending.popleft().result()

    def ranges(self) -> Dict[str, float]:
        """Dynamic range per tensor, by the calibrator."""
        self._flush()
        with self._lock:
            return {name: self.calibrator.amax(h) for name, h in self.histograms.items()}

    def table(self) -> CalibrationTable:
        return CalibrationTable(self.calibrator.header, self.ranges())


class CalibrationEngine:
    """Runs `network` in FP32 on the numpy backend, recording its tensors into a Collector."""

    def __init__(self, network: Network):
        while fold_constants(network) | eliminate_dead_layers(network):
            pass
        network.lint()
        for layer in network.layers:
            layer.precision = None if layer.kind == "Constant" else "FP32"
        self.network = network
        self._backend = NumpyBackend()
        self._last_use: Dict[str, int] = {}
        for i, layer in enumerate(network.layers):
            for t in layer.inputs:
                self._last_use[t.name] = i
        for t in network.outputs:
            self._last_use[t.name] = len(network.layers)

    def execute(self, arrays: Sequence[np.ndarray], collector: Collector) -> List[np.ndarray]:
        """The network's outputs for `arrays` (in binding order); every float tensor is recorded."""
        net = self.network
        values = {}
        for t, a in zip(net.inputs, arrays):
            values[t.name] = np.asarray(a)
            collector.observe(t.name, values[t.name])
        for i, layer in enumerate(net.layers):
            outs = self._backend.run_layer(layer, [values[t.name] for t in layer.inputs])
            for t, out in zip(layer.outputs, outs):
                values[t.name] = out
                if layer.kind != "Constant":
                    collector.observe(t.name, np.asarray(out))
            for t in layer.inputs:
                if self._last_use.get(t.name) == i:
                    values.pop(t.name, None)
        shapes = tuple(tuple(np.shape(a)) for a in arrays)
        with collector._lock:
            collector.batches += 1
            if shapes not in collector.shapes:
                collector.shapes.append(shapes)
        return [values[t.name] for t in net.outputs]
