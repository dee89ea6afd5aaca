"""Running engines: Engine, ExecutionContext, Runtime and the Profiler hook (TensorRT-like names)."""
from __future__ import annotations

import threading
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from tftrt_py.engine import layers as layer_kinds
from tftrt_py.engine import plan
from tftrt_py.engine.backends import get_backend
from tftrt_py.engine.backends.base import Allocate, Call
from tftrt_py.engine.errors import BackendError, NetworkError, PlanError, RuntimeExecutionError
from tftrt_py.engine.inspector import layer_rows
from tftrt_py.engine.network import Network, Tensor
from tftrt_py.engine.profile import OptimizationProfile

__all__ = ["Engine", "ExecutionContext", "Runtime", "Profiler", "rebatched", "deserialize"]

def rowwise(network: Network) -> bool:
    """True when output row i depends only on input row i (so a smaller batch can be served, padded to the
    engine's batch B).

    Inside, a batched tensor's dim 0 holds the rows of the batch in order, each as one block of dim0 / B
    entries: a reshape [B, S, H] -> [B*S, H] keeps rows apart, as does the reshape back; the outputs' dim 0
    is the batch again.
    """
    dims = {t.shape[0] if t.rank else None for t in network.inputs}
    if len(dims) != 1 or None in dims:
        return False
    (batch,) = dims
    batched = {t.name for t in network.inputs}
    for layer in network.layers:
        flags = [t.name in batched for t in layer.inputs]
        if not any(flags):
            continue
        if not layer_kinds.get(layer.kind).rowwise(layer, flags):
            return False
        for t in layer.outputs:
            if not t.rank or t.shape[0] % batch:
                return False
            batched.add(t.name)
    return all(t.name in batched and t.shape[0] == batch for t in network.outputs)


def rebatched(network: Network, batch: int) -> Network:
    """A copy of row-wise `network` for inputs of `batch` rows: the same layers, names, params, weights,
    precisions and dynamic ranges (an engine built from it serves that batch without padding).

    Raises NetworkError when the network mixes rows or a layer's params fix the batch (a reshape to
    an explicit batch): its shapes would not follow.
    """
    if not rowwise(network):
        raise NetworkError(f"network {network.name!r} mixes rows of its batch: it cannot be re-batched")
    new = Network(network.name)
    tensors: Dict[str, Tensor] = {}
    batched = set()

    def copy(old: Tensor, tensor: Tensor, is_batched: bool) -> None:
        want = (batch, *old.shape[1:]) if is_batched else old.shape
        if tensor.shape != want:
            raise NetworkError(f"network {network.name!r}: tensor {old.name!r} would be {list(tensor.shape)} at "
                               f"batch {batch}, not {list(want)} (its layer's params fix the batch)")
        tensor.name, tensor.dynamic_range = old.name, old.dynamic_range
        new._names.add(old.name)
        tensors[old.name] = tensor
        if is_batched:
            batched.add(old.name)

    for t in network.inputs:
        copy(t, new.add_input(t.name, t.dtype, (batch, *t.shape[1:])), True)
    for layer in network.layers:
        try:
            made = new.add_layer(layer.kind, [tensors[t.name] for t in layer.inputs], layer.params, layer.weights,
                                 name=layer.name)
        except NetworkError as exc:
            raise NetworkError(f"network {network.name!r}: layer {layer.name!r} does not take batch {batch} (its "
                               f"params fix the batch): {exc}") from None
        made.precision = layer.precision
        is_batched = any(t.name in batched for t in layer.inputs)
        for old, tensor in zip(layer.outputs, made.outputs):
            copy(old, tensor, is_batched)
    new.outputs = [tensors[t.name] for t in network.outputs]
    return new


class Profiler:
    """Receives per-layer times in milliseconds (like TensorRT's IProfiler)."""

    def __init__(self):
        self.records: Dict[str, List[float]] = {}

    def report_layer_time(self, layer_name: str, ms: float) -> None:
        self.records.setdefault(layer_name, []).append(ms)


class Engine:
    """A built, runnable network: bindings, optimized layers, precision and build metadata."""

    def __init__(self, network: Network, precision: str = "FP32", backend: str = "numpy",
                 build_config: Optional[dict] = None, tactics: Optional[dict] = None,
                 device: Optional[str] = None, profile: Optional[OptimizationProfile] = None):
        self.network = network
        self.profile = profile  # the profile this shape-specialised engine was built for, if any
        self.precision = precision
        self.backend_name = backend
        self.build_config = dict(build_config or {})
        self.tactics = dict(tactics or {})
        self.device = device or "cpu"
        self.rowwise = rowwise(network)
        # The backend compiles the whole engine: now for a fresh build, on first use for a deserialized plan
        # (which carries its tactics).
        self._prepare_lock = threading.Lock()
        self._prepared = False
        if tactics is None:
            self.prepare()

    def prepare(self) -> None:
        """Let the backend compile the whole engine (tactics, device check) once."""
        with self._prepare_lock:
            if not self._prepared:
                get_backend(self.backend_name).prepare_engine(self)
                self._prepared = True

    # -- bindings ---------------------------------------------------------
    @property
    def name(self) -> str:
        return self.network.name

    @property
    def inputs(self) -> List[Tensor]:
        return self.network.inputs

    @property
    def outputs(self) -> List[Tensor]:
        return self.network.outputs

    @property
    def num_bindings(self) -> int:
        return len(self.inputs) + len(self.outputs)

    def get_binding_name(self, index: int) -> str:
        return (self.inputs + self.outputs)[index].name

    def binding_is_input(self, index: int) -> bool:
        return index < len(self.inputs)

    def get_binding_index(self, name: str) -> int:
        """Index of binding `name`, or -1 (as TensorRT) when there is none."""
        names = [t.name for t in self.inputs + self.outputs]
        return names.index(name) if name in names else -1

    def _binding(self, index_or_name) -> Tensor:
        index = self.get_binding_index(index_or_name) if isinstance(index_or_name, str) else index_or_name
        if not 0 <= index < self.num_bindings:
            raise RuntimeExecutionError(f"no binding {index_or_name!r}; bindings are "
                                        f"{[t.name for t in self.inputs + self.outputs]}")
        return (self.inputs + self.outputs)[index]

    def get_binding_shape(self, index_or_name) -> Tuple[int, ...]:
        """Shape the engine was built for, by binding index or name."""
        return self._binding(index_or_name).shape

    def get_binding_dtype(self, index_or_name) -> np.dtype:
        """numpy dtype of a binding, by index or name."""
        return np.dtype(self._binding(index_or_name).dtype)

    @property
    def max_batch_size(self) -> int:
        return self.inputs[0].shape[0] if self.inputs and self.inputs[0].rank else 1

    def can_serve(self, shapes: Sequence[Tuple[int, ...]]) -> bool:
        """Shapes equal the engine's, or (row-wise engines) one batch <= the engine's with equal other dims."""
        shapes = [tuple(s) for s in shapes]
        if len(shapes) != len(self.inputs):
            return False
        if all(s == t.shape for s, t in zip(shapes, self.inputs)):
            return True
        if not self.rowwise or len({s[0] if s else None for s in shapes}) != 1:
            return False
        return all(len(s) == t.rank and t.rank and s[1:] == t.shape[1:] and s[0] <= t.shape[0]
                   for s, t in zip(shapes, self.inputs))

    @property
    def weight_bytes(self) -> int:
        return sum(w.nbytes for layer in self.network.layers for w in layer.weights.values())

    def for_batch(self, batch: int) -> "Engine":
        """This row-wise engine built for `batch` rows: its optimized network re-batched (:func:`rebatched`: the
        same layers, precisions and ranges), compiled by the same backend; NetworkError where the network's
        params fix the batch."""
        engine = Engine(rebatched(self.network, batch), precision=self.precision, backend=self.backend_name,
                        build_config=self.build_config, device=self.device, profile=self.profile)
        engine.binding = getattr(self, "binding", None)
        return engine

    # -- API --------------------------------------------------------------
    def create_execution_context(self) -> "ExecutionContext":
        return ExecutionContext(self)

    def serialize(self) -> bytes:
        return plan.serialize(self)

    def inspect(self) -> List[dict]:
        """The final layers: name, kind, precision, input and output shapes (see engine.inspector)."""
        return layer_rows(self)


class ExecutionContext:
    """Runs one engine; each context may be used from one thread at a time."""

    def __init__(self, engine: Engine):
        self.engine = engine
        self.backend = get_backend(engine.backend_name)
        self.profiler: Optional[Profiler] = None
        self._pad_buffers: Dict[str, np.ndarray] = {}  # input name -> the engine's batch of rows (see _pad)
        engine.prepare()
        self._runner = self.backend.create_runner(engine)

    def _check_inputs(self, bindings: Mapping[str, np.ndarray], pad: bool = True
                      ) -> Tuple[Dict[str, np.ndarray], Optional[int]]:
        """Input arrays by binding name, checked against the engine, and the batch (None: no batch dim).
        With `pad`, a smaller batch of a row-wise engine is padded to the engine's (its last row repeated)."""
        eng = self.engine
        inputs = eng.inputs
        missing = [t.name for t in inputs if t.name not in bindings]
        if missing:
            raise RuntimeExecutionError(f"missing input bindings {missing}; engine inputs are "
                                        f"{[t.name for t in inputs]}")
        values, batch, exact = {}, None, True
        for t in inputs:
            arr = np.asarray(bindings[t.name])
            if arr.dtype != t.dtype:  # a dtype equals its name; its .name property costs more than the check
                raise RuntimeExecutionError(
                    f"input {t.name!r} has dtype {arr.dtype.name}, the engine expects {t.dtype}")
            values[t.name] = arr
            exact = exact and arr.shape == t.shape
        if exact:  # the shapes the engine was built for (a call's usual case)
            return values, (inputs[0].shape[0] if inputs and inputs[0].rank else None)
        shapes = [values[t.name].shape for t in inputs]
        if not eng.can_serve(shapes):
            raise RuntimeExecutionError(
                f"input shapes {[list(s) for s in shapes]} cannot be served by this engine, built for "
                f"{[list(t.shape) for t in eng.inputs]}" + (" (batch <= engine batch allowed)" if eng.rowwise else ""))
        if eng.inputs and eng.inputs[0].rank:
            batch = shapes[0][0]
            if pad and batch < eng.max_batch_size:
                values = {k: self._pad(k, v) for k, v in values.items()}
        return values, batch

    def _pad(self, name: str, rows: np.ndarray) -> np.ndarray:
        """`rows` and copies of its last row up to the engine's batch, in this context's buffer for input `name`:
        written again by its next padded call (one thread at a time, see the class), and reused rather than
        allocated for every call, whose fresh pages cost more than the copy (a served batch of 600 KB images)."""
        buffer = self._pad_buffers.get(name)
        if buffer is None or buffer.shape[1:] != rows.shape[1:] or buffer.dtype != rows.dtype:
            buffer = self._pad_buffers[name] = np.empty((self.engine.max_batch_size,) + rows.shape[1:], rows.dtype)
        batch = len(rows)
        buffer[:batch] = rows
        buffer[batch:] = rows[-1:]
        return buffer

    def padded_view(self, array: np.ndarray) -> bool:
        """Whether `array` (an output) may share memory with this context's padding buffers: an engine that hands
        an input through as an output; the caller copies it before the next call writes the buffer again."""
        return any(np.may_share_memory(array, buffer) for buffer in self._pad_buffers.values())

    def execute(self, bindings: Mapping[str, np.ndarray], outputs: Optional[Allocate] = None
                ) -> Dict[str, np.ndarray]:
        """Run the engine on input arrays keyed by binding name; returns outputs by binding name.

        `outputs(index, shape)`, when given, returns the writable array output `index` is written into (a
        caller's buffer: TRTEngineOp hands TensorFlow's output tensors), and those arrays are returned.
        """
        return self._runner.execute(self, bindings, outputs)

    def execute_v2(self, inputs: Sequence[np.ndarray], outputs: Optional[Allocate] = None) -> List[np.ndarray]:
        """Positional form of :meth:`execute`: inputs in binding order, outputs in binding order."""
        outs = self.execute({t.name: a for t, a in zip(self.engine.inputs, inputs)}, outputs)
        return [outs[t.name] for t in self.engine.outputs]

    def call(self) -> Optional[Call]:
        """A :data:`~tftrt_py.engine.backends.base.Call` of this engine: the run of :meth:`execute_v2` for inputs
        of exactly the engine's binding shapes and dtypes, which it does not check (the caller has), and which
        several threads may make at once; None where the backend offers none. It reports no layer times."""
        return self._runner.call(self)

    @property
    def replays(self) -> bool:
        """Whether the backend can offer native replays of this engine (see :meth:`native_replay`)."""
        return self._runner.replays

    def native_replay(self, inputs: Sequence[np.ndarray], out_dtypes: Sequence[np.dtype]):
        """This context as a :class:`~tftrt_py.engine.replay.Replay` at the shapes of `inputs` (binding order), for
        a caller outside Python to run; None where the backend offers none (numpy, onnxruntime) or cannot here."""
        return self._runner.native_replay(self, list(inputs), list(out_dtypes)) if self.replays else None

    def execute_async(self, bindings: Mapping[str, np.ndarray], stream=None) -> Dict[str, np.ndarray]:
        """On the CPU backend this runs synchronously; `stream` is accepted for API compatibility."""
        return self.execute(bindings)


class Runtime:
    """Deserializes plans into engines, run by `backend` (default: the backend each plan was built for)."""

    def __init__(self, backend: Optional[str] = None):
        self.backend = backend

    def deserialize_cuda_engine(self, data: bytes) -> Engine:
        return deserialize(data, backend=self.backend)


def deserialize(data: bytes, backend: Optional[str] = None) -> Engine:
    """Engine from plan bytes, run by `backend` (default: the plan's); raises PlanError naming what is wrong."""
    loaded = plan.deserialize(data, backend)
    try:
        engine = Engine(loaded.network, precision=loaded.precision, backend=loaded.backend,
                        build_config=loaded.build_config, tactics=loaded.tactics, device=loaded.device,
                        profile=loaded.profile)
    except BackendError:  # the plan is fine; its backend is missing here
        raise
    except Exception as exc:  # a kind's batch rule on inconsistent params: pure code, any error means a bad plan
        raise PlanError(f"plan header is inconsistent ({type(exc).__name__}: {exc})") from None
    engine.binding = loaded.binding
    return engine
