"""The Python side of the TRTEngineOp kernel: engine cache, builds and native fallback.

The C++ kernel (kernel.cc) calls three functions of this module, looked up by name on
every call:

- ``create(node_def: bytes, function_def: bytes, callees: bytes) -> int`` when a kernel is constructed
  (callees: the FunctionDefLibrary of the functions the native segment reaches);
- ``run(handle, inputs, assets, allocate) -> list[np.ndarray] | None`` per execution, where inputs
  is a list of ``(dtype name, shape tuple, memoryview)`` (TensorFlow's buffers, not copied), assets
  the ``engine_assets`` strings as bytes and ``allocate(index, shape) -> memoryview`` allocates an
  output tensor for the engine to write into; None asks the kernel to run the native segment function;
- ``replay(handle, inputs) -> (list[int], Replay) | None | False`` after a run the engine served, when the
  kernel has no native replay for those input shapes (or fewer than its limit): a replay it then runs itself,
  without Python (engine.replay); None: not now; False: never for this op (its backend offers none);
- ``release(handle)`` when the kernel is destroyed;
- ``warn(message)``: the kernel's warnings, logged here.

Kernels of one loaded function share one :class:`EngineOp`: the op is keyed by the segment key, the
native segment function's name (``tf.saved_model.load`` gives each load's functions new names) and the
segment's digest (:func:`segment_binding`), so a function instantiated twice builds each engine once,
while two models, or two loads of one, never share engines, caches or settings. An op goes (engines, contexts
and buffers with it) when its last kernel is released, that is when the last model holding it is dropped (see
engine_op.lifetime); a converter pins the ops of its segment keys (:func:`pin`) so they outlive the functions it
re-creates between convert(), build() and save(). Engines carry the digest of the segment they were built for and
an op refuses others.
"""
from __future__ import annotations

import collections
import dataclasses
import itertools
import logging
import os
import threading
import weakref
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from tftrt_py.convert.errors import MissingQuantizationRangeError
from tftrt_py.convert.params import DEFAULT_CALIBRATORS
from tftrt_py.convert.rewrite import ALLOW_BUILD_ATTR
from tftrt_py.convert.variables import weight_inputs
from tftrt_py.engine import BuilderConfig, EngineError, Runtime
from tftrt_py.engine.plan import MAGIC as PLAN_MAGIC
from tftrt_py.engine.replay import RUNS
from tftrt_py.engine.types import QUANTIZED
from tftrt_py.engine_op.binding import segment_binding
from tftrt_py.engine_op.cache import EngineCache, read_asset, unpack_plans
from tftrt_py.engine_op.calibration import OpCalibration
from tftrt_py.engine_op.gpu_memory import prepare_tensorflow_gpus
from tftrt_py.engine_op.buckets import serving_pool
from tftrt_py.engine_op.profile_engine import ProfileEngine

__all__ = ["create", "run", "replay", "release", "warn", "pin", "EngineOp", "engine_ops", "stats", "FALLBACK_ENV",
           "NativeFallbackForbidden", "RecursiveSegmentError", "start_collecting", "stop_collecting", "start_calibrating",
           "finish_calibrating"]

logger = logging.getLogger(__name__)

#: TF-TRT's switch: "0"/"false" forbids running the native segment (then it is an error).
FALLBACK_ENV = "TF_TRT_ALLOW_ENGINE_NATIVE_SEGMENT_EXECUTION"


class NativeFallbackForbidden(RuntimeError):
    """The op would run its native segment but FALLBACK_ENV forbids it: the kernel fails with
    tf.errors.AbortedError (``error_code``), TF-TRT's "User disallowed engine native segment execution"."""

    error_code = 10  # ABORTED, read by kernel.cc


class RecursiveSegmentError(ValueError):
    """The op's native segment function holds a TRTEngineOp or calls itself (a crafted model): the kernel fails
    with tf.errors.InvalidArgumentError rather than recurse without end."""


def native_fallback_allowed() -> bool:
    """FALLBACK_ENV read as TF's ReadBoolFromEnvVar does: "0"/"false" (any case) forbid, "1"/"true" or unset
    allow, anything else is logged and allows."""
    value = os.environ.get(FALLBACK_ENV, "").strip().lower()
    if value in ("0", "false"):
        return False
    if value not in ("", "1", "true"):
        logger.error("%s=%r is not a boolean (0, 1, false or true); native segment execution stays allowed",
                     FALLBACK_ENV, os.environ[FALLBACK_ENV])
    return True


#: "0" keeps every engine-op call in Python (no native replays, see engine.replay).
REPLAY_ENV = "TFTRT_PY_NATIVE_REPLAY"


def native_replays_allowed() -> bool:
    return os.environ.get(REPLAY_ENV, "1").strip().lower() not in ("0", "false")


#: Names the engine backend of engine ops ("numpy" or "cupy"); default: cupy when a GPU is usable.
BACKEND_ENV = "TFTRT_PY_BACKEND"
_backend_lock = threading.Lock()
_backend_name: Optional[str] = None


def engine_backend() -> str:
    """The backend engine ops build for, decided once per process (and said once when it is the CPU's)."""
    global _backend_name
    with _backend_lock:
        if _backend_name is None:
            from tftrt_py.engine.backends import default_backend_name

            _backend_name = os.environ.get(BACKEND_ENV) or default_backend_name()
            if _backend_name == "numpy":
                logger.warning("TRTEngineOp engines run on the CPU (numpy backend): no usable NVIDIA GPU with "
                               "cupy here; set %s=cupy to require the GPU", BACKEND_ENV)
        if _backend_name == "cupy":  # TensorFlow's GPUs leave engines memory, or every engine op fails saying why
            prepare_tensorflow_gpus()
        return _backend_name


@dataclasses.dataclass
class Stats:
    """Counters of one engine op, readable through :func:`stats`."""

    hits: int = 0
    builds: int = 0
    build_failures: int = 0
    evictions: int = 0
    engine_runs: int = 0  # through Python; see native_runs
    specialisations: int = 0  # per-shape engines built inside profile engines (see profile_engine)
    fallbacks: collections.Counter = dataclasses.field(default_factory=collections.Counter)

    replay_states: list = dataclasses.field(default_factory=list)  # Replay.state of each replay handed out

    @property
    def native_runs(self) -> int:
        """Runs the kernels made without Python (native replays)."""
        return sum(int(state[RUNS]) for state in list(self.replay_states))

    def as_dict(self) -> dict:
        """The counters; engine_runs and hits include the native runs."""
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "replay_states"}
        native = self.native_runs
        d.update(fallbacks=dict(self.fallbacks), fallback_total=sum(self.fallbacks.values()), native_runs=native,
                 engine_runs=self.engine_runs + native, hits=self.hits + native)
        return d


class EngineOp:
    """State shared by the kernels of one loaded segment function: engine cache, stats, the segment graph.

    Per-kernel settings (allow_build_at_runtime) stay with the kernel's handle.
    """

    profiler = None  # an engine.Profiler receiving layer times, see set_profiler

    def __init__(self, node_def, function_def: bytes, callees: bytes = b""):
        from tftrt_py.convert.graph import NodeView

        node = NodeView(node_def)
        self.name = node.name.split("/")[-1]  # canonical: without the prefix of an inlining call
        self.segment_key = node.attr("segment_key") or node.name
        self.precision = node.attr("precision_mode", b"FP32").decode().upper()
        self.out_dtypes = [np.dtype(t) for t in node.attr("OutT") or []]
        self._node_def = node_def
        self._unbound_weights = bool(weight_inputs(node_def))
        self.workspace = int(node.attr("workspace_size_bytes") or 1 << 30)
        self.backend = engine_backend()
        self.cache = EngineCache(int(node.attr("max_cached_engines_count") or 1))
        self.stats = Stats()
        self._segment_graph = None
        self._binding: Optional[tuple] = None  # (function_def, its digest)
        self._callees = b""
        self.set_function(function_def, callees)
        self._contexts: Dict[tuple, object] = {}
        self._lock = threading.RLock()
        self._loaded_assets: set = set()
        self._asset_paths: Optional[set] = None  # the assets of the first run with assets (see load_assets)
        self._logged: set = set()
        self._replays = weakref.WeakSet()  # native replays the kernels hold (they own them)
        self.native: Dict[tuple, str] = {}  # input shapes that ran the native segment -> why (the latest reason)
        # INT8 and FP8: the calibration table, or the collector filling it (see engine_op.calibration)
        ranged = self.precision in QUANTIZED
        self.calibration = OpCalibration(self.name, ranged and bool(node.attr("use_calibration")),
                                         (node.attr("calibration_data") or b"") if ranged else b"",
                                         DEFAULT_CALIBRATORS.get(self.precision, "entropy"))
        self.missing_ranges: Dict[tuple, List[str]] = {}  # input shapes -> tensors their INT8/FP8 build lacked
        static = node.attr("serialized_segment") or b""
        if static and not static.startswith(PLAN_MAGIC) and self._segment_from_serialized(static):
            static = b""  # a dynamic op without function backup carries its segment GraphDef (TF-TRT 1.x)
        if static:
            self.add_plan(static, source="serialized_segment")

    # -- engines ------------------------------------------------------------
    @property
    def binding(self) -> str:
        """The digest engines of this op carry (see :func:`segment_binding`; computed once per segment function:
        0.4 s for Keras ResNet50's)."""
        if self._binding is None or self._binding[0] is not self._function_def:
            self._binding = (self._function_def, segment_binding(self._node_def, self._function_def, self._callees))
        return self._binding[1]

    def set_function(self, function_def: bytes, callees: bytes = b"") -> None:
        """Take the native segment FunctionDef (and the FunctionDefLibrary of the functions it reaches); one that
        recurses (see segment_refusal) refuses every run."""
        from tensorflow.core.framework import function_pb2

        from tftrt_py.convert.build import segment_refusal

        self._function_def, self._callees = function_def, callees
        reached = function_pb2.FunctionDefLibrary.FromString(callees).function if callees else ()
        self.refused = segment_refusal(function_pb2.FunctionDef.FromString(function_def), reached) \
            if function_def else None
        if self.refused:
            logger.error("TRTEngineOp %s refuses every input: %s", self.name, self.refused)

    def add_plan(self, plan: bytes, source: str) -> None:
        """Put a serialized engine into the cache (a bad plan, or one built for another segment, is logged and
        skipped). Engines from files must carry this op's binding; the node's own serialized_segment need not."""
        try:
            engine = Runtime(backend=self.backend).deserialize_cuda_engine(plan)
        except EngineError as exc:
            logger.error("%s: ignoring engine from %s: %s", self.name, source, exc)
            return
        if source != "serialized_segment" and engine.binding != self.binding:
            logger.error("%s: ignoring engine from %s: it was built for another segment, bindings or precision "
                         "(digest %s, this op's is %s)", self.name, source, engine.binding, self.binding)
            return
        with self._lock:
            if getattr(engine, "profile", None) is None:
                self._insert(tuple(t.shape for t in engine.inputs), engine)
                return
            key = engine.profile.key
            if key not in self.cache.keys():
                self._insert(key, self._profile_engine(engine.profile))
            self.cache.get(key).add(engine)

    def _insert(self, key, engine) -> None:
        evicted = self.cache.insert(key, engine)
        self._contexts[key] = engine if isinstance(engine, ProfileEngine) else serving_pool(engine)
        self._contexts[key].profiler = self.profiler
        if evicted is not None:
            self.revoke_replays()
            self._contexts.pop(evicted, None)
            self.stats.evictions += 1

    def load_assets(self, assets: Sequence[bytes]) -> None:
        """Restore the engines saved in `assets` (paths). The assets of the op's first run with assets are its own:
        a kernel of another model naming this op's segment function (so sharing the op) cannot add engines to it."""
        paths = [path.decode() if isinstance(path, bytes) else str(path) for path in assets]
        if self._asset_paths is None and paths:  # once: the lock stays off the per-call path
            with self._lock:
                if self._asset_paths is None:
                    self._asset_paths = set(paths)
        for path in paths:
            if path in self._loaded_assets:
                continue
            self._loaded_assets.add(path)
            if path not in self._asset_paths:
                logger.error("%s: ignoring engines from %s: this op serves the engines saved with its model (%s); "
                             "another model's engine op names its native segment function", self.name, path,
                             ", ".join(sorted(self._asset_paths)))
                continue
            try:
                plans = unpack_plans(read_asset(path))
            except EngineError as exc:
                logger.error("%s: cannot read saved engines, building or running natively as without them: %s",
                             self.name, exc)
                continue
            for plan in plans:
                self.add_plan(plan, source=path)
            logger.info("%s: restored %d engine(s) from %s", self.name, len(plans), path)

    def _segment_from_serialized(self, data: bytes) -> bool:
        """Take the segment from a serialized segment GraphDef; False when `data` is not one."""
        from google.protobuf.message import DecodeError
        from tensorflow.core.framework import graph_pb2

        from tftrt_py.convert.build import INPUT_PREFIX, SegmentGraph

        try:
            graph_def = graph_pb2.GraphDef.FromString(data)
        except DecodeError:
            return False
        if not any(n.name.startswith(INPUT_PREFIX) for n in graph_def.node):
            return False
        self._segment_graph = SegmentGraph.from_graph_def(graph_def)
        return True

    def segment_graph(self):
        """The segment, from the native segment FunctionDef."""
        if self._segment_graph is None:
            from tensorflow.core.framework import function_pb2

            from tftrt_py.convert.build import SegmentGraph

            if not self._function_def:
                raise EngineError("the native segment function is unavailable, so no engine can be built")
            self._segment_graph = SegmentGraph.from_function_def(function_pb2.FunctionDef.FromString(self._function_def))
        return self._segment_graph

    def builder_config(self) -> BuilderConfig:
        return BuilderConfig(precision=self.precision, max_workspace_size=self.workspace, backend=self.backend)

    def build(self, shapes):
        """Build and cache an engine for `shapes`; its cache key, or None (remembered) when the build fails."""
        from tftrt_py.convert.build import build_engine

        try:
            engine = build_engine(self.segment_graph(), list(shapes), name=self.name,
                                  config=self.builder_config(), ranges=self.calibration.ranges)
        except Exception as exc:  # any failure means: remember it and run the native segment
            self.cache.failed[shapes] = f"{type(exc).__name__}: {exc}"
            if isinstance(exc, MissingQuantizationRangeError):
                self.missing_ranges[shapes] = exc.tensors
            self.stats.build_failures += 1
            return None
        engine.binding = self.binding
        self.stats.builds += 1
        self._insert(shapes, engine)
        return shapes

    def engines(self) -> List[object]:
        """Every engine held, a profile engine's specialisations one by one."""
        with self._lock:
            return [e for entry in self.cache.engines()
                    for e in (entry.engines() if isinstance(entry, ProfileEngine) else [entry])]

    @property
    def batch_copies(self) -> int:
        """Copies of this op's row-wise engines built for smaller batches (see engine_op.buckets)."""
        with self._lock:
            return sum(entry.copies for entry in self._contexts.values())

    # -- shape profiles -----------------------------------------------------
    def _profile_engine(self, profile) -> ProfileEngine:
        return ProfileEngine(profile, self._specialiser(profile))

    def _specialiser(self, profile):
        """The function a profile engine calls to build an engine for concrete shapes inside `profile`."""
        def specialise(shapes):
            from tftrt_py.convert.build import build_engine

            engine = build_engine(self.segment_graph(), list(shapes), name=self.name,
                                  config=self.builder_config(), ranges=self.calibration.ranges)
            engine.profile, engine.binding = profile, self.binding
            self.stats.specialisations += 1
            return engine
        return specialise

    def add_profiles(self, profiles, shapes=()) -> None:
        """One profile engine per profile (specialised for its opt shapes); then each of `shapes` is made
        ready in the engine that will serve it, so those shapes need no work when served. Shapes left
        without an engine are remembered in ``native`` with the failure."""
        failed = {}
        with self._lock:
            for profile in profiles:
                if profile.key in self.cache.keys():
                    continue
                entry = self._profile_engine(profile)
                try:
                    entry.context_for(profile.opt)
                except EngineError as exc:
                    self.stats.build_failures += 1
                    failed[profile] = f"the engine for profile {profile} failed to build: {exc}"
                    logger.warning("%s: %s", self.name, failed[profile])
                    continue
                self.stats.builds += 1
                self._insert(profile.key, entry)
            for s in dict.fromkeys(tuple(tuple(d) for d in s) for s in shapes):
                key = self.cache.lookup(s)
                entry = None if key is None else self.cache.get(key)
                if entry is None:
                    self.native[s] = next((why for p, why in failed.items() if p.contains(s)),
                                          f"no engine serves input shapes {list(s)}")
                elif isinstance(entry, ProfileEngine):
                    try:
                        entry.context_for(s)
                    except EngineError as exc:
                        self.native[s] = str(exc)
                        logger.warning("%s: %s", self.name, exc)

    def set_profiler(self, profiler) -> None:
        """Report per-layer times of this op's engines (now and built later) to `profiler` (None: stop)."""
        with self._lock:
            self.revoke_replays()  # layer times need the Python path
            self.profiler = profiler
            for context in self._contexts.values():
                context.profiler = profiler

    # -- execution ----------------------------------------------------------
    def run(self, arrays: List[np.ndarray], assets: Sequence[bytes], allow_build: bool = True, allocate=None
            ) -> Optional[List[np.ndarray]]:
        """Outputs of the engine serving `arrays` (building one if allowed), or None to run natively.

        `allocate(index, shape)` (the kernel's) gives the buffer of TensorFlow's output tensor: engines write
        their outputs there, and the arrays returned are views of them.
        """
        if self.refused:  # neither an engine nor the native segment: both would recurse
            raise RecursiveSegmentError(f"no engine or native segment can serve it: {self.refused}")
        if assets:
            self.load_assets(assets)
        shapes = tuple(tuple(a.shape) for a in arrays)
        if _COLLECTING:
            with _LOCK:
                collected = _COLLECTING.get(_text(self.segment_key))
            if collected is not None:  # profile collection (TF-TRT's _profile_generation_mode): run natively
                if shapes not in collected:
                    collected.append(shapes)
                return None
        if self._unbound_weights:  # variables kept as variables: engines take their values as weights
            self._bind_weights(arrays)
        if self.calibration.active:  # INT8 calibration: an FP32 engine records its tensors
            return self._calibrate(arrays)
        context = self._context_for(shapes, allow_build)
        if context is None:
            return None
        out_dtypes = self.out_dtypes
        outputs = None if allocate is None else (
            lambda i, shape: np.frombuffer(allocate(i, shape), out_dtypes[i]).reshape(shape))
        try:
            outs = context.execute_v2(arrays, outputs)
        except Exception as exc:
            return self.fallback("runtime_failure", f"the engine failed at run time: {type(exc).__name__}: {exc}",
                                 shapes)
        self.stats.engine_runs += 1
        return [o if o.dtype == dt else np.asarray(o, dtype=dt) for o, dt in zip(outs, out_dtypes)]

    def native_replay(self, arrays: List[np.ndarray]):
        """A native replay of the engine serving `arrays` (which it just served), for the kernel: None when not
        now (profiling, calibrating, collecting shapes, limit reached), False when never (native replays off, or
        the backend offers none)."""
        if not native_replays_allowed():
            return False
        shapes = tuple(tuple(a.shape) for a in arrays)
        with self._lock:
            if self.profiler is not None or self.calibration.active or self._unbound_weights or \
                    _COLLECTING.get(_text(self.segment_key)) is not None:
                return None
            key = self.cache.lookup(shapes)
            entry = None if key is None else self._contexts.get(key)
            try:  # while a better pool for these shapes is built, the kernel asks again later
                pool = None if entry is None or entry.pending(shapes) else entry.context_for(shapes)
            except EngineError:
                return None
        if pool is None:
            return None
        if not pool.replays:
            return False
        replay = pool.export(arrays, self.out_dtypes)
        if replay is not None:
            with self._lock:
                self.stats.replay_states.append(replay.state)
                self._replays.add(replay)
        return replay

    def revoke_replays(self) -> None:
        """Send every call back through Python (kernels drop their replays; new ones may be offered later)."""
        with self._lock:
            for replay in list(self._replays):
                replay.revoke()

    def _bind_weights(self, arrays: List[np.ndarray]) -> None:
        """Give the segment the values of the op's weight inputs (variables read natively, see
        convert.variables) from its first run, so engines built at serving time have them."""
        from tftrt_py.convert.variables import bind_weights

        with self._lock:
            if self._unbound_weights and self._function_def:
                bind_weights(self.segment_graph(), self._node_def, arrays)
                self._unbound_weights = False

    def _context_for(self, shapes, allow_build: bool):
        """The context (pool) serving `shapes`, building an engine when allowed; None after a fallback."""
        with self._lock:
            key = self.cache.lookup(shapes)
            if key is not None:
                self.stats.hits += 1
            elif shapes in self.cache.failed:
                return self.fallback("build_failed", f"the engine build for {list(shapes)} failed: "
                                                     f"{self.cache.failed[shapes]}", shapes)
            elif not allow_build:
                return self.fallback("no_engine", f"no engine serves input shapes {list(shapes)} and "
                                                  f"allow_build_at_runtime is False", shapes)
            else:
                key = self.build(shapes)
                if key is None:
                    return self.fallback("build_failed", f"the engine build for {list(shapes)} failed: "
                                                         f"{self.cache.failed[shapes]}", shapes)
            try:
                return self._contexts[key].context_for(shapes)
            except EngineError as exc:
                return self.fallback("build_failed", str(exc), shapes)

    # -- INT8 calibration -----------------------------------------------------
    def _calibrate(self, arrays: List[np.ndarray]) -> Optional[List[np.ndarray]]:
        from tftrt_py.convert.build import calibration_engine

        try:
            outs = self.calibration.run(
                lambda shapes: calibration_engine(self.segment_graph(), list(shapes), name=self.name), arrays)
        except Exception as exc:
            return self.fallback("calibration_failed", f"INT8 calibration failed: {type(exc).__name__}: {exc}",
                                 tuple(tuple(a.shape) for a in arrays))
        return [np.asarray(o, dtype=dt, order="C") for o, dt in zip(outs, self.out_dtypes)]

    def calibration_table(self) -> bytes:
        """The calibration table (TensorRT's text format; b"" when there is none).

        Finishes a calibration in progress, then builds the INT8 engines for the input shapes calibrated,
        as TF-TRT's calibration does.
        """
        shapes = self.calibration.finish()
        with self._lock:
            for s in shapes:
                if self.cache.lookup(s) is None and s not in self.cache.failed and self.build(s) is None:
                    logger.warning("%s: the INT8 engine for %s failed to build: %s", self.name, list(s),
                                   self.cache.failed[s])
        return self.calibration.table

    def fallback(self, reason: str, detail: str, shapes: tuple) -> None:
        """Count, remember (by input `shapes`) and log (once per reason) a native-segment run; raise when
        fallback is forbidden."""
        self.stats.fallbacks[reason] += 1
        self.native[shapes] = detail
        if not native_fallback_allowed():
            raise NativeFallbackForbidden(f"User disallowed engine native segment execution ({FALLBACK_ENV}="
                                          f"{os.environ[FALLBACK_ENV]}): {detail}")
        if reason not in self._logged:
            self._logged.add(reason)
            logger.warning("TRTEngineOp %s runs its native segment: %s", self.name, detail)
        return None


_OPS: Dict[tuple, EngineOp] = {}  # (segment key, segment function name, binding) -> op
#: segment key -> the op created last for it: what find() gives the converter; while the key is pinned the op
#: outlives its kernels (a converter's function rebuilt: kernels released, then created again)
_LATEST: Dict[str, EngineOp] = {}
_PINS: Dict[str, int] = {}  # segment key -> pins held (see pin)
_USERS: Dict[int, int] = {}  # id(op) -> kernels holding it
_HANDLES: Dict[int, Tuple[EngineOp, bool]] = {}
_COUNTER = itertools.count(1)
_LOCK = threading.Lock()
_COLLECTING: Dict[str, List[tuple]] = {}  # segment key -> input shapes seen while collecting
_CALIBRATING: Dict[str, Optional[str]] = {}  # segment key of an op not created yet -> its calibrator (None: default)


def _text(key) -> str:
    return key.decode() if isinstance(key, bytes) else str(key)


def start_collecting(segment_key: str) -> None:
    """Until stop_collecting, the op of `segment_key` records its input shapes and runs its native segment."""
    with _LOCK:
        _COLLECTING[_text(segment_key)] = []
        ops = [op for op in _OPS.values() if _text(op.segment_key) == _text(segment_key)]
    for op in ops:
        op.revoke_replays()


def stop_collecting(segment_key: str) -> List[tuple]:
    """The distinct input shapes (one tuple per input) recorded since start_collecting, in arrival order."""
    with _LOCK:
        return _COLLECTING.pop(_text(segment_key), [])


def start_calibrating(segment_key: str, algorithm: Optional[str] = None) -> None:
    """The op of `segment_key` (now, or once it is created) calibrates with `algorithm` (None: its precision's
    default) until finish_calibrating."""
    key = _text(segment_key)
    with _LOCK:
        op = _LATEST.get(key)
        if op is None:
            _CALIBRATING[key] = algorithm
    if op is not None:
        op.revoke_replays()
        op.calibration.start(algorithm)


def finish_calibrating(segment_key: str) -> bytes:
    """The calibration table of the op of `segment_key` (b"" when it never ran); see EngineOp.calibration_table."""
    key = _text(segment_key)
    with _LOCK:
        _CALIBRATING.pop(key, None)
        op = _LATEST.get(key)
    if op is None:
        logger.warning("Warning calibration error for %s: it never ran during calibration", key)
        return b""
    return op.calibration_table()


def create(node_def: bytes, function_def: bytes, callees: bytes = b"") -> int:
    from tensorflow.core.framework import function_pb2, node_def_pb2

    node = node_def_pb2.NodeDef.FromString(node_def)
    segment_key = node.attr["segment_key"].s.decode() or node.name
    with _LOCK:
        func = function_pb2.FunctionDef.FromString(function_def).signature.name if function_def else ""
        key = (segment_key, func, segment_binding(node, function_def, callees))
        op = _OPS.get(key)
        latest = _LATEST.get(segment_key)
        if op is None and latest is not None and latest.key == key:  # the converter's op, its function rebuilt
            op = _OPS[key] = latest
        calibration_data = node.attr["calibration_data"].s if "calibration_data" in node.attr else b""
        if op is None:
            op = _OPS[key] = _LATEST[segment_key] = EngineOp(node, function_def, callees)
            op.key = key
            if segment_key in _CALIBRATING:
                op.calibration.start(_CALIBRATING.pop(segment_key))
        elif calibration_data and op.precision in QUANTIZED and not op.calibration.table:  # a calibrated graph
            op.calibration.set_table(calibration_data)
        if function_def and not op._function_def:
            op.set_function(function_def, callees)
            op.cache.failed.clear()  # builds that failed for want of the segment (e.g. TF constant folding)
        handle = next(_COUNTER)
        _HANDLES[handle] = (op, node.attr[ALLOW_BUILD_ATTR].b if ALLOW_BUILD_ATTR in node.attr else True)
        _USERS[id(op)] = _USERS.get(id(op), 0) + 1
    return handle


def run(handle: int, inputs, assets, allocate=None) -> Optional[List[np.ndarray]]:
    op, allow_build = _HANDLES[handle]
    arrays = [np.frombuffer(buf, dtype=dtype).reshape(shape) for dtype, shape, buf in inputs]
    return op.run(arrays, assets, allow_build, allocate)


def replay(handle: int, inputs):
    """A native replay for the kernel of `handle` at `inputs` (as for run): (its packed form, the replay, which
    the kernel keeps alive while it holds it), None (not now) or False (never for this op)."""
    op, _ = _HANDLES[handle]
    arrays = [np.frombuffer(buf, dtype=dtype).reshape(shape) for dtype, shape, buf in inputs]
    found = op.native_replay(arrays)
    return (found.pack(), found) if found else found


def warn(message: str) -> None:
    logger.warning("%s", message)


def release(handle: int) -> None:
    """A kernel is destroyed: its op goes (engines and all) with the last kernel holding it."""
    with _LOCK:
        op, _ = _HANDLES.pop(handle, (None, None))
        if op is None:
            return
        _USERS[id(op)] -= 1
        if _USERS[id(op)] > 0:
            return
        del _USERS[id(op)]
        for key in [k for k, v in _OPS.items() if v is op]:
            del _OPS[key]
        key = _text(op.segment_key)
        if _LATEST.get(key) is op and key not in _PINS:
            del _LATEST[key]


def pin(segment_keys) -> Callable[[], None]:
    """Keep the ops of `segment_keys` (now and created later) alive while no kernel holds them, until the function
    returned is called (once; a converter calls it when it is dropped)."""
    keys = [_text(k) for k in segment_keys]
    with _LOCK:
        for key in keys:
            _PINS[key] = _PINS.get(key, 0) + 1
    done = []

    def unpin() -> None:
        with _LOCK:
            if done:
                return
            done.append(True)
            for key in keys:
                _PINS[key] -= 1
                if _PINS[key]:
                    continue
                del _PINS[key]
                op = _LATEST.get(key)
                if op is not None and id(op) not in _USERS:
                    del _LATEST[key]
    return unpin


def engine_ops() -> Dict[tuple, EngineOp]:
    """Every engine op alive in this process, by (segment key, segment function name, binding)."""
    with _LOCK:
        return dict(_OPS)


def find(segment_key: str) -> Optional[EngineOp]:
    """The op created last for `segment_key` (the converter's: its keys are fresh per conversion)."""
    with _LOCK:
        return _LATEST.get(segment_key)


def stats() -> Dict[str, dict]:
    """Counters (hits, builds, build failures, evictions, engine runs, fallbacks) by engine op name, with the
    engines cached and ``batch_copies``: the copies of row-wise engines built for smaller batches (engine_op.buckets).

    Where ops of several models (or loads) share a name, the one created last keeps the plain name and the
    others add their native segment function's name: ``"TRTEngineOp_000_000 [<function>]"``.
    """
    ops = list(engine_ops().values())  # in creation order
    last = {op.name: op for op in ops}
    return {(op.name if last[op.name] is op else f"{op.name} [{op.key[1]}]"):
            dict(op.stats.as_dict(), engines=len(op.cache), batch_copies=op.batch_copies) for op in ops}
