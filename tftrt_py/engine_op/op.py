"""One engine op: the engines of a loaded segment function, their cache, builds, runs and native fallback.

Kernels of one loaded function share one :class:`EngineOp` (see engine_op.dispatcher): an engine serving the input
shapes runs (building one when allowed and none does), else the op answers None and the kernel runs the native
segment function, counted in :class:`Stats` and logged once per reason.
"""
from __future__ import annotations

import collections
import dataclasses
import functools
import logging
import threading
import weakref
from typing import Dict, List, Optional, Sequence

import numpy as np
from tensorflow.core.framework import function_pb2

from tftrt_py import settings
from tftrt_py.convert import build as build_lib
from tftrt_py.convert.errors import MissingQuantizationRangeError
from tftrt_py.convert.graph import NodeView
from tftrt_py.convert.params import DEFAULT_CALIBRATORS
from tftrt_py.convert.variables import bind_weights, engine_inputs, weight_inputs
from tftrt_py.engine import BuilderConfig, EngineError
from tftrt_py.engine.backends import cupy as cupy_backend, default_backend_name, get_backend
from tftrt_py.engine.plan import MAGIC as PLAN_MAGIC
from tftrt_py.engine.replay import RUNS
from tftrt_py.engine.types import QUANTIZED
from tftrt_py.engine_op import loading
from tftrt_py.engine_op.binding import segment_binding
from tftrt_py.engine_op.buckets import serving_pool
from tftrt_py.engine_op.cache import EngineCache
from tftrt_py.engine_op.calibration import OpCalibration
from tftrt_py.engine_op.gpu_memory import prepare_tensorflow_gpus
from tftrt_py.engine_op.profile_engine import ProfileEngine

__all__ = ["EngineOp", "Stats", "NativeFallbackForbidden", "RecursiveSegmentError", "FALLBACK_ENV", "REPLAY_ENV",
           "BACKEND_ENV", "native_fallback_allowed", "native_replays_allowed", "engine_backend", "warm_up_backend",
           "warm_up_device"]

logger = logging.getLogger(__name__)

#: TF-TRT's switch: "0"/"false" forbids running the native segment (then it is an error).
FALLBACK_ENV = settings.NATIVE_FALLBACK.name
#: "0" keeps every engine-op call in Python (no native replays, see engine.replay).
REPLAY_ENV = settings.NATIVE_REPLAY.name
#: Names the engine backend of engine ops (numpy, onnxruntime or cupy); default: the best available.
BACKEND_ENV = settings.BACKEND.name


def native_fallback_allowed() -> bool:
    """FALLBACK_ENV read as TF's ReadBoolFromEnvVar does: "0"/"false" (any case) forbid, "1"/"true" or unset
    allow, anything else is logged and allows."""
    return settings.NATIVE_FALLBACK.get()


def native_replays_allowed() -> bool:
    return settings.NATIVE_REPLAY.get()


_backend_lock = threading.Lock()
_backend_name: Optional[str] = None


def engine_backend() -> str:
    """The backend engine ops build for, decided once per process (said once when, not chosen, it is numpy)."""
    global _backend_name
    with _backend_lock:
        if _backend_name is None:
            chosen = settings.BACKEND.get()
            _backend_name = chosen or default_backend_name()
            if _backend_name == "numpy" and chosen is None:  # the fallback of last resort, not a choice
                logger.warning("TRTEngineOp engines run on the CPU (numpy backend): no usable NVIDIA GPU with "
                               "cupy here; set %s=cupy to require the GPU", BACKEND_ENV)
        if _backend_name == "cupy":  # TensorFlow's GPUs leave engines memory, or every engine op fails saying why
            prepare_tensorflow_gpus()
        return _backend_name


_warm_ups: Dict[str, threading.Thread] = {}  # the background warm-ups started, by thread name


def _start_once(name: str, target) -> threading.Thread:
    """The daemon thread `name` running `target`, started on the first call in this process."""
    with _backend_lock:
        if name not in _warm_ups:
            _warm_ups[name] = threading.Thread(target=target, name=name, daemon=True)
            _warm_ups[name].start()
        return _warm_ups[name]


def warm_up_backend(timing_cache=None) -> threading.Thread:
    """Start (once per process) choosing the engine backend and loading its libraries on a background thread, so a
    conversion's engine ops find them loaded: on a GPU machine cupy, CUDA's context, the cuDNN frontend and
    nvmath-python, which then overlap the loading of the model, and the processes its INT8 builds compile ahead in
    (Backend.warm_up with calibrating; the conversion builds with `timing_cache`). A calibrating conversion starts it
    (its first engine op needs the backend within seconds, to compile the INT8 build's kernels ahead): the loading
    holds the GIL most of the time, so the model's load waits on it, and for a conversion that does not calibrate
    that costs more than loading the backend when the first engine builds (keras-hub BERT-base FP16 on an H200
    machine: convert 2.4 s without the thread against 3.5-3.8 s with it, build 0.55 s longer). A failure there is
    the engine ops' to report when they ask for the backend; here it is only logged."""
    return _start_once("tftrt-backend-warm-up", functools.partial(_load_backend, timing_cache))


def warm_up_device() -> Optional[threading.Thread]:
    """Start (once per process) the GPU's driver and context and import cupy on a background thread, where engine
    ops may build on the GPU (the backend is cupy or not chosen yet), for a conversion that does not calibrate: the
    driver's calls hold no GIL (cupy_backend.start_driver); cupy's import does, and slows the model's loading beside
    it less than it saves the first build (keras-hub BERT-base FP16 on an H200 machine: convert 1.55 -> 1.72 s,
    build 1.76 -> 1.14 s). The rest of the backend loads with the first build (warm_up_backend says why). None
    where the backend chosen is another."""
    if settings.BACKEND.get() not in (None, "cupy"):
        return None
    return _start_once("tftrt-device-warm-up", _start_device)


def _start_device() -> None:
    if cupy_backend.start_driver():
        cupy_backend.available()  # (imports cupy; a failure there is the engine ops' to report)


def _load_backend(timing_cache) -> None:
    try:
        get_backend(engine_backend()).warm_up(calibrating=True, timing_cache=timing_cache)
    except Exception as exc:  # the engine ops will say it when they build
        logger.debug("engine backend warm-up: %s", exc)


class NativeFallbackForbidden(RuntimeError):
    """The op would run its native segment but FALLBACK_ENV forbids it: the kernel fails with
    tf.errors.AbortedError (``error_code``), TF-TRT's "User disallowed engine native segment execution"."""

    error_code = 10  # ABORTED, read by kernel.cc


class RecursiveSegmentError(ValueError):
    """The op's native segment function holds a TRTEngineOp or calls itself (a crafted model): the kernel fails
    with tf.errors.InvalidArgumentError rather than recurse without end."""


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
    timing_cache = None  # BuilderConfig.timing_cache of its builds (a converter's, see dispatcher.pin)

    def __init__(self, node_def, function_def: bytes, callees: bytes = b"", binding: Optional[str] = None):
        node = NodeView(node_def)
        self.name = node.name.split("/")[-1]  # canonical: without the prefix of an inlining call
        self.segment_key = node.attr("segment_key") or node.name
        self.precision = node.attr("precision_mode", b"FP32").decode().upper()
        self.out_dtypes = [np.dtype(t) for t in node.attr("OutT") or []]
        self._node_def = node_def
        #: the inputs its engines bind: all but the weight inputs (variable values, see convert.variables), which
        #: engines take as weights once (see _bind_weights) and no call passes on
        self._weight_inputs = frozenset(weight_inputs(node_def))
        self._engine_inputs = engine_inputs(node_def) if self._weight_inputs else None
        self._unbound_weights = self._engine_inputs is not None
        self.workspace = int(node.attr("workspace_size_bytes") or 1 << 30)
        self.backend = engine_backend()
        self.cache = EngineCache(int(node.attr("max_cached_engines_count") or 1))
        self.stats = Stats()
        self._segment_graph = None
        self._binding: Optional[tuple] = None  # (function_def, its digest)
        #: kernel input shapes -> (cache key, engine inputs, Call), or False where no Call serves them: how calls of
        #: those shapes run once an engine served them exactly (see serve); emptied whenever calls must take the
        #: full path (revoke_replays) or the engine serving them may change
        self._calls: Dict[tuple, object] = {}
        self._callees = b""
        self.set_function(function_def, callees)
        if binding is not None:  # computed by the caller already (a whole pass over the weights)
            self._binding = (self._function_def, binding)
        self._contexts: Dict[tuple, object] = {}
        self._assets_seen: set = set()  # the asset strings of runs so far, as the kernel passes them
        self.lock = threading.RLock()
        self.loaded_assets: set = set()
        self.asset_paths: Optional[set] = None  # the assets of the first run with assets (see loading.load_assets)
        self.collecting: Optional[List[tuple]] = None  # input shapes seen while collecting (see dispatcher)
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
        if static and not static.startswith(PLAN_MAGIC):  # a dynamic op without function backup (TF-TRT 1.x)
            self._segment_graph = loading.segment_from_serialized(static)
            static = b"" if self._segment_graph is not None else static
        if static:
            loading.add_plan(self, static, source="serialized_segment")

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
        self._function_def, self._callees = function_def, callees
        self._calls.clear()
        reached = function_pb2.FunctionDefLibrary.FromString(callees).function if callees else ()
        self.refused = build_lib.segment_refusal(function_pb2.FunctionDef.FromString(function_def), reached) \
            if function_def else None
        if self.refused:
            logger.error("TRTEngineOp %s refuses every input: %s", self.name, self.refused)

    def insert(self, key, engine) -> None:
        """Cache `engine` (or a profile engine) under `key`, with the contexts that serve it."""
        self._calls.clear()  # the engine serving some shapes may change
        evicted = self.cache.insert(key, engine)
        self._contexts[key] = engine if isinstance(engine, ProfileEngine) else serving_pool(engine)
        self._contexts[key].profiler = self.profiler
        if evicted is not None:
            self.revoke_replays()
            self._contexts.pop(evicted, None)
            self.stats.evictions += 1

    def segment_graph(self):
        """The segment, from the native segment FunctionDef."""
        if self._segment_graph is None:
            if not self._function_def:
                raise EngineError("the native segment function is unavailable, so no engine can be built")
            function = function_pb2.FunctionDef.FromString(self._function_def)
            self._segment_graph = build_lib.SegmentGraph.from_function_def(function)
        return self._segment_graph

    def builder_config(self) -> BuilderConfig:
        return BuilderConfig(precision=self.precision, max_workspace_size=self.workspace, backend=self.backend,
                             timing_cache=self.timing_cache)

    def build(self, shapes):
        """Build and cache an engine for `shapes`; its cache key, or None (remembered) when the build fails."""
        try:
            engine = build_lib.build_engine(self.segment_graph(), list(shapes), name=self.name,
                                  config=self.builder_config(), ranges=self.calibration.ranges)
        except Exception as exc:  # any failure means: remember it and run the native segment
            self.cache.failed[shapes] = f"{type(exc).__name__}: {exc}"
            if isinstance(exc, MissingQuantizationRangeError):
                self.missing_ranges[shapes] = exc.tensors
            self.stats.build_failures += 1
            return None
        engine.binding = self.binding
        self.stats.builds += 1
        self.insert(shapes, engine)
        return shapes

    def engines(self) -> List[object]:
        """Every engine held, a profile engine's specialisations one by one."""
        with self.lock:
            return [e for entry in self.cache.engines()
                    for e in (entry.engines() if isinstance(entry, ProfileEngine) else [entry])]

    @property
    def batch_copies(self) -> int:
        """Copies of this op's row-wise engines built for smaller batches (see engine_op.buckets)."""
        with self.lock:
            return sum(entry.copies for entry in self._contexts.values())

    def wait_for_builds(self, timeout: Optional[float] = None) -> None:
        """Return when the engine copies this op's engines started building in the background (for smaller
        batches, see engine_op.buckets) have been built, or after about `timeout` seconds per copy."""
        with self.lock:
            entries = list(self._contexts.values())
        for entry in entries:
            entry.wait(timeout)

    # -- shape profiles -----------------------------------------------------
    def profile_engine(self, profile) -> ProfileEngine:
        """An empty profile engine of this op for `profile`."""
        return ProfileEngine(profile, self._specialiser(profile))

    def _specialiser(self, profile):
        """The function a profile engine calls to build an engine for concrete shapes inside `profile`."""
        def specialise(shapes):
            engine = build_lib.build_engine(self.segment_graph(), list(shapes), name=self.name,
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
        with self.lock:
            for profile in profiles:
                if profile.key in self.cache.keys():
                    continue
                entry = self.profile_engine(profile)
                try:
                    entry.context_for(profile.opt)
                except EngineError as exc:
                    self.stats.build_failures += 1
                    failed[profile] = f"the engine for profile {profile} failed to build: {exc}"
                    logger.warning("%s: %s", self.name, failed[profile])
                    continue
                self.stats.builds += 1
                self.insert(profile.key, entry)
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
        with self.lock:
            self.revoke_replays()  # layer times need the Python path
            self.profiler = profiler
            for context in self._contexts.values():
                context.profiler = profiler

    # -- execution ----------------------------------------------------------
    def arrays(self, inputs) -> List[Optional[np.ndarray]]:
        """The kernel's inputs ((dtype name, shape, buffer) each) as arrays over TensorFlow's buffers; once the
        weights are bound, None for the weight inputs (engines do not read them)."""
        skip = () if self._unbound_weights or self._engine_inputs is None else self._weight_inputs
        return [None if i in skip else np.frombuffer(buf, dtype=dtype).reshape(shape)
                for i, (dtype, shape, buf) in enumerate(inputs)]

    def serve(self, inputs, assets: Sequence[bytes], allow_build: bool = True, allocate=None
              ) -> Optional[List[np.ndarray]]:
        """:meth:`run` on the kernel's `inputs` (as for :meth:`arrays`). Shapes an engine served exactly before
        run its :meth:`ExecutionContext.call <tftrt_py.engine.runtime.ExecutionContext.call>` directly: the same
        engine, counters and fallback, without the checks and look-ups that shapes already passed. Such a call
        returns the engine's own output arrays, which the kernel copies into TensorFlow's outputs (ONNX Runtime's
        outputs are arrays of its own: writing them through `allocate` would copy them as often, with more calls
        through Python)."""
        found = self._calls.get(tuple([shape for _, shape, _ in inputs]))
        if not found or (assets and not self._assets_seen.issuperset(assets)):
            return self.run(self.arrays(inputs), assets, allow_build, allocate, remember=None if found is False
                            else inputs)
        key, used, call = found
        arrays = [np.frombuffer(inputs[i][2], inputs[i][0]).reshape(inputs[i][1]) for i in used]
        try:
            outs = call(arrays, None)
        except Exception as exc:
            return self.fallback("runtime_failure", f"the engine failed at run time: {type(exc).__name__}: {exc}",
                                 tuple(tuple(a.shape) for a in arrays))
        self.cache.touch(key)
        self.stats.hits += 1
        self.stats.engine_runs += 1
        return outs

    def _remember_call(self, inputs, arrays: List[np.ndarray], key, context) -> None:
        """After `context` (serving cache `key`) ran `arrays` (the engine inputs of the kernel's `inputs`): keep
        its Call for these shapes (False: none serves them) unless something needs the full path now."""
        engine = getattr(context, "engine", None)
        exact = engine is not None and [t.shape for t in engine.inputs] == [a.shape for a in arrays] and \
            [np.dtype(t.dtype) for t in engine.inputs] == [a.dtype for a in arrays] and \
            [np.dtype(t.dtype) for t in engine.outputs] == self.out_dtypes
        call = context.call() if exact and hasattr(context, "call") else None
        used = list(self._engine_inputs if self._engine_inputs is not None else range(len(inputs)))
        with self.lock:  # revoke_replays empties the map under this lock: a call kept here is never stale
            if self.profiler is None and self.collecting is None and not self.calibration.active and \
                    not self._unbound_weights and not self.refused and key in self.cache.keys():
                self._calls[tuple([tuple(shape) for _, shape, _ in inputs])] = (key, used, call) if call else False

    def run(self, arrays: List[np.ndarray], assets: Sequence[bytes], allow_build: bool = True, allocate=None,
            remember=None) -> Optional[List[np.ndarray]]:
        """Outputs of the engine serving `arrays` (building one if allowed), or None to run natively.

        `allocate(index, shape)` (the kernel's) gives the buffer of TensorFlow's output tensor: engines write
        their outputs there, and the arrays returned are views of them. `remember`: the kernel's inputs these
        arrays came from, whose shapes :meth:`serve` then runs directly when this engine serves them exactly.
        """
        if self.refused:  # neither an engine nor the native segment: both would recurse
            raise RecursiveSegmentError(f"no engine or native segment can serve it: {self.refused}")
        if assets:
            loading.load_assets(self, assets)
            self._assets_seen.update(assets)
        weights = arrays if self._unbound_weights else None  # bound once an engine is built from the segment
        if self._engine_inputs is not None:  # variables kept as variables: engines take their values as weights
            arrays = [arrays[i] for i in self._engine_inputs]
        shapes = tuple(tuple(a.shape) for a in arrays)
        collected = self.collecting
        if collected is not None:  # profile collection (TF-TRT's _profile_generation_mode): run natively
            if shapes not in collected:
                collected.append(shapes)
            return None
        if self.calibration.active:  # INT8 calibration: an FP32 engine records its tensors
            if weights is not None:
                self._bind_weights(weights)
            return self._calibrate(arrays)
        found = self._context_for(shapes, allow_build, weights)
        if found is None:
            return None
        key, context = found
        out_dtypes = self.out_dtypes
        outputs = None if allocate is None else (
            lambda i, shape: np.frombuffer(allocate(i, shape), out_dtypes[i]).reshape(shape))
        try:
            outs = context.execute_v2(arrays, outputs)
        except Exception as exc:
            return self.fallback("runtime_failure", f"the engine failed at run time: {type(exc).__name__}: {exc}",
                                 shapes)
        self.stats.engine_runs += 1
        if remember is not None:
            self._remember_call(remember, arrays, key, context)
        return [o if o.dtype == dt else np.asarray(o, dtype=dt) for o, dt in zip(outs, out_dtypes)]

    def native_replay(self, arrays: List[np.ndarray]):
        """A native replay of the engine serving `arrays` (which it just served), for the kernel: None when not
        now (profiling, calibrating, collecting shapes, limit reached), False when never (native replays off, or
        the backend offers none)."""
        if not native_replays_allowed():
            return False
        if self._engine_inputs is not None:
            arrays = [arrays[i] for i in self._engine_inputs]
        shapes = tuple(tuple(a.shape) for a in arrays)
        with self.lock:
            if self.profiler is not None or self.calibration.active or \
                    self.collecting is not None:
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
            with self.lock:
                self.stats.replay_states.append(replay.state)
                self._replays.add(replay)
        return replay

    def revoke_replays(self) -> None:
        """Send every call back through Python (kernels drop their replays; new ones may be offered later)."""
        with self.lock:
            self._calls.clear()
            for replay in list(self._replays):
                replay.revoke()

    def _bind_weights(self, arrays, copy: bool = True) -> None:
        """Give the segment the values of the op's weight inputs (variables read natively, see
        convert.variables): from the first run needing a build (copies of the kernel's inputs), or from the
        converter before (`arrays` by input index, reads of its variables, kept as they are)."""
        with self.lock:
            if self._unbound_weights and self._function_def:
                bind_weights(self.segment_graph(), self._node_def, arrays, copy=copy)
                self._unbound_weights = False

    def bind_weights(self, values) -> None:
        """Take `values` (weight input index -> a variable's read) as the weights of the op's engines, unless it
        has them already (the converter's, see dispatcher.pin)."""
        self._bind_weights(values, copy=False)

    def _context_for(self, shapes, allow_build: bool, weights=None):
        """(cache key, the context (pool) serving `shapes`), building an engine when allowed; None after a
        fallback. An engine
        built from the segment takes the weight inputs' values from `weights` (this run's inputs), unless bound:
        engines loaded from plans have theirs."""
        with self.lock:
            key = self.cache.lookup(shapes)
            if weights is not None and (key is None or isinstance(self.cache.get(key), ProfileEngine)):
                self._bind_weights(weights)
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
                return key, self._contexts[key].context_for(shapes)
            except EngineError as exc:
                return self.fallback("build_failed", str(exc), shapes)

    # -- INT8 calibration -----------------------------------------------------
    def _calibrate(self, arrays: List[np.ndarray]) -> Optional[List[np.ndarray]]:
        try:
            outs = self.calibration.run(
                lambda shapes: build_lib.calibration_engine(self.segment_graph(), list(shapes), name=self.name,
                                                            config=self.builder_config()), arrays)
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
        with self.lock:
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
                                          f"{settings.NATIVE_FALLBACK.raw()}): {detail}")
        if reason not in self._logged:
            self._logged.add(reason)
            logger.warning("TRTEngineOp %s runs its native segment: %s", self.name, detail)
        return None
