"""Collecting calibration statistics: what an engine op runs while it calibrates.

A :class:`CalibrationEngine` is the op's network in FP32, before fusion (only constants are folded), so
every tensor a later INT8 build may need a range for exists and keeps the name it will have there. It
runs on the GPU where the INT8 builds will (one engine, every tensor binned on the device), else on ONNX
Runtime (the numpy backend where that is missing), and hands each float tensor's values to a :class:`Collector`,
which keeps one histogram per tensor and turns them into a calibration table with its calibrator.
"""
from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import copy
import logging
import os
import threading
import zlib
from typing import Dict, List, Optional, Sequence

import numpy as np

from tftrt_py.calibration.calibrators import Histogram, get_calibrator
from tftrt_py.calibration.table import CalibrationTable
from tftrt_py.engine import budget
from tftrt_py.engine.backends import get_backend
from tftrt_py.engine.backends.numpy_backend import NumpyBackend
from tftrt_py.engine.builder.passes import eliminate_dead_layers, fold_constants
from tftrt_py.engine.errors import BackendError
from tftrt_py.engine.network import Network
from tftrt_py.engine.runtime import Engine

__all__ = ["Collector", "CalibrationEngine", "EngineRecording", "RECORDING_SHARE"]

logger = logging.getLogger(__name__)

FLOATS = ("float32", "float16")


class Collector:
    """Histograms of every float tensor an op's calibration engines computed, over all calibration batches.

    Binning a tensor takes about as long as computing it, so it runs in threads of their own while the engine
    computes the next layers (numpy's ufuncs let them run): each tensor always in the same thread (its name picks
    one of BINNING_THREADS), so its batches are binned in the order they were observed (a histogram's counts depend
    on the order its range grew in), at most MAX_PENDING tensors waiting.
    """

    #: Threads binning tensors side by side (at most the process's CPUs).
    BINNING_THREADS = 4
    #: Tensors observed but not yet binned, at most: each holds its memory until it is.
    MAX_PENDING = 8

    def __init__(self, algorithm: str = "entropy"):
        self.calibrator = get_calibrator(algorithm)
        self.histograms: Dict[str, Histogram] = {}
        self.batches = 0
        self.shapes: List[tuple] = []  # distinct input shapes seen, in arrival order
        self._lock = threading.Lock()
        self._binning = [concurrent.futures.ThreadPoolExecutor(1, f"tftrt-calibration-binning-{i}")
                         for i in range(max(1, min(self.BINNING_THREADS, os.cpu_count() or 1)))]
        self._pending: collections.deque = collections.deque()  # futures of binnings, oldest first
        self._pending_lock = threading.Lock()

    def observe(self, name: str, value, device=None) -> None:
        """Bin `value` into the histogram of tensor `name`: a host array in its binning thread (a failure is raised
        by a later observe or by :meth:`ranges`); with `device`, an array of that backend's on its device, now
        (after the tensors observed before it: a tensor's batches are binned in order)."""
        if value.dtype.name not in FLOATS:
            return
        if device is not None:
            self._flush()
            self._add(name, value, device)
            return
        binning = self._binning[zlib.crc32(name.encode()) % len(self._binning)]
        with self._pending_lock:
            while len(self._pending) >= self.MAX_PENDING:
                self._pending.popleft().result()
            self._pending.append(binning.submit(self._add, name, value))

    def _add(self, name: str, value, device=None) -> None:
        with self._lock:
            histogram = self.histograms.setdefault(name, Histogram(binned=self.calibrator.binned))
        histogram.add(value, device)

    def _flush(self) -> None:
        """Wait until every observed tensor is binned."""
        with self._pending_lock:
            while self._pending:
                self._pending.popleft().result()

    def ranges(self) -> Dict[str, float]:
        """Dynamic range per tensor, by the calibrator: the tensors side by side in the binning threads (the entropy
        calibrator's search takes ~6 ms a tensor, numpy's array operations, which let other threads run: ResNet-50's
        229 tensors took 1.3 s one after another on an H200 machine)."""
        self._flush()
        with self._lock:
            histograms = dict(self.histograms)
        names = list(histograms)
        pools = self._binning
        futures = [pools[i % len(pools)].submit(self.calibrator.amax, histograms[name]) for i, name in enumerate(names)]
        return {name: future.result() for name, future in zip(names, futures)}

    def table(self) -> CalibrationTable:
        return CalibrationTable(self.calibrator.header, self.ranges())


#: The share of the memory an engine may take (engine.budget) that a device recording's tensors may fill: every
#: tensor of the network is held at once, and the INT8 builds that follow need the device too.
RECORDING_SHARE = 0.5


class EngineRecording:
    """A step computing every tensor of `network` as one FP32 engine of `backend` (a backend that
    :attr:`~tftrt_py.engine.backends.base.Backend.calibrates`) with every float tensor an output, run on that
    backend's arrays: the tensors it leaves in the values stay where they were computed (the collector bins them
    there), the network's outputs are copied to the host."""

    def __init__(self, network: Network, backend: str):
        recording = copy.copy(network)
        recording.outputs = list(network.outputs) + [
            t for layer in network.layers if layer.kind != "Constant" for t in layer.outputs
            if t.dtype in FLOATS and not network.is_output(t)]
        limit = budget.engine_bytes_limit(backend)
        need = budget.peak_memory(recording).total
        if need > limit.value * RECORDING_SHARE:
            raise BackendError(f"its tensors take {budget.size(need)} at once, over {RECORDING_SHARE:.0%} of "
                               f"{limit.source} ({budget.size(limit.value)})")
        self.layers, self.network = network.layers, network
        self.device = get_backend(backend)  # bins the tensors it computes
        self.lock = threading.Lock()  # held from a run until its tensors are binned: the next run overwrites them
        self._context = Engine(recording, precision="FP32", backend=backend).create_execution_context()

    def run(self, values: Dict[str, object]) -> None:
        inputs = {t.name: self.device.to_device(values[t.name]) for t in self.network.inputs}
        values.update(self._context.execute(inputs))
        for t in self.network.outputs:
            values[t.name] = self.device.to_host(values[t.name])


def _steps(network: Network, backend: Optional[str]) -> list:
    """Steps computing every tensor of `network`: one engine of `backend` when it calibrates on its device and
    the tensors fit (EngineRecording), else ONNX Runtime's sessions where it runs here (its convolutions and
    matrix multiplies several times faster than the numpy kernels'), else the numpy backend's layers."""
    if backend is not None:
        try:
            if get_backend(backend).calibrates:
                return [EngineRecording(network, backend)]
        except Exception as exc:  # not usable here, over its memory, or a layer it cannot build this way
            logger.info("calibrating %s on the host, not on %s: %s: %s", network.name, backend, type(exc).__name__,
                        exc)
    try:
        return get_backend("onnxruntime").recording_steps(network)
    except Exception as exc:  # not installed, or a layer it cannot lower here
        logger.debug("calibrating %s on the numpy backend: %s: %s", network.name, type(exc).__name__, exc)
        return NumpyBackend().recording_steps(network)


class CalibrationEngine:
    """Runs `network` in FP32 (on the device of `backend`, the backend the INT8 builds will use, where it
    calibrates there; else ONNX Runtime's kernels or the numpy backend's), recording its tensors into a
    Collector."""

    def __init__(self, network: Network, backend: Optional[str] = None):
        while fold_constants(network) | eliminate_dead_layers(network):
            pass
        network.lint()
        for layer in network.layers:
            layer.precision = None if layer.kind == "Constant" else "FP32"
        self.network = network
        self._steps = _steps(network, backend)
        self._last_use: Dict[str, int] = {}
        for i, step in enumerate(self._steps):
            for layer in step.layers:
                for t in layer.inputs:
                    self._last_use[t.name] = i
        for t in network.outputs:
            self._last_use[t.name] = len(self._steps)

    def execute(self, arrays: Sequence[np.ndarray], collector: Collector) -> List[np.ndarray]:
        """The network's outputs for `arrays` (in binding order); every float tensor is recorded."""
        net = self.network
        values = {}
        for t, a in zip(net.inputs, arrays):
            values[t.name] = np.asarray(a)
            collector.observe(t.name, values[t.name])
        for i, step in enumerate(self._steps):
            device = getattr(step, "device", None)
            with step.lock if device is not None else contextlib.nullcontext():
                step.run(values)
                for layer in step.layers:
                    if layer.kind != "Constant":
                        for t in layer.outputs:
                            value = values[t.name]
                            collector.observe(t.name, value if device is not None else np.asarray(value), device)
            for layer in step.layers:
                for t in [*layer.inputs, *layer.outputs]:
                    if self._last_use.get(t.name, -1) <= i:
                        values.pop(t.name, None)
        shapes = tuple(tuple(np.shape(a)) for a in arrays)
        with collector._lock:
            collector.batches += 1
            if shapes not in collector.shapes:
                collector.shapes.append(shapes)
        return [values[t.name] for t in net.outputs]
