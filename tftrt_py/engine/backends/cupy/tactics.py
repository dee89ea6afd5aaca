"""Tactic selection: build every candidate op of a layer, time each on this GPU (a CUDA graph of a
few runs, replayed and timed with events, so host overhead does not count), keep the fastest.

The candidates are timed in interleaved rounds (each one's median counts), after the GPU has been kept busy
for WARM_UP_MS when it was idle (a build can follow minutes of CPU work, e.g. TensorFlow's INT8 calibration):
timed one after another, candidates timed while clocks rise or other work shares the GPU would lose to those
timed later for no reason of their own.

Layers with the same signature (kind, shapes, dtypes, params) share the choice, and a tactic
recorded in a plan for this GPU, or in the timing cache (engine/timing_cache.py) for this GPU, these
library versions and these build options, is rebuilt directly instead of being timed again.
With ``TFTRT_PY_CHECK_TACTICS=1`` every candidate is also checked against the numpy backend on
the same random inputs and dropped (with a warning) when it disagrees.
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import importlib.metadata
import json
import logging
import statistics
import threading
import time
from typing import Dict, List, Optional, Tuple

import numpy as np

import tftrt_py
from tftrt_py import settings
from tftrt_py.engine.backends.cupy import _device, cudnn_warmup, kernels
from tftrt_py.engine.backends.cupy.ops.base import Op, Spec
from tftrt_py.engine.errors import BackendError
from tftrt_py.engine.timing_cache import TimingCacheError, TimingKey

__all__ = ["Tuner", "KeepAlive", "capture", "CAPTURE_LOCK", "device_versions"]

logger = logging.getLogger(__name__)

#: Held while capturing a CUDA graph and while creating a context's handles and buffers: those
#: calls may synchronize the device, which would invalidate another thread's capture.
CAPTURE_LOCK = threading.RLock()

_MATCH_KEYS = ("op", "fusion", "plan", "im2col", "pad_c", "epilogue", "epilogues", "tile")

#: GPU milliseconds of work before timing when the GPU has been idle for IDLE_S seconds; timing rounds; runs of
#: an op per timed replay.
WARM_UP_MS = 25.0
IDLE_S = 0.5
ROUNDS = 5
INNER = 5
#: Threads building candidates side by side (Tuner.prebuild).
PREBUILD_THREADS = 8


class KeepAlive:
    """A cupy allocator for graph capture: blocks come from the pool and are never given back,
    so memory a captured graph touches stays valid for as long as this object lives."""

    def __init__(self):
        self.blocks = []

    def __call__(self, nbytes):
        mem = _device.require().get_default_memory_pool().malloc(nbytes)
        self.blocks.append(mem)
        return mem


def capture(stream, fn) -> Tuple[object, KeepAlive]:
    """Capture what `fn()` enqueues on `stream` into a CUDA graph; (graph, the memory it keeps)."""
    cupy = _device.require()
    keep = KeepAlive()
    with CAPTURE_LOCK, stream, cupy.cuda.using_allocator(keep):
        stream.begin_capture()
        try:
            fn()
        except BaseException:
            try:
                stream.end_capture()
            except Exception:
                pass
            raise
        graph = stream.end_capture()
    return graph, keep


def _matches(tactic: dict, prefer: dict) -> bool:
    return all(tactic.get(k) == prefer.get(k) for k in _MATCH_KEYS if k in prefer)


def _distribution(name: str) -> Optional[str]:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


@functools.lru_cache(maxsize=None)
def device_versions() -> Dict[str, object]:
    """This GPU and the versions of what builds and runs its kernels: the timing cache's device key."""
    cupy = _device.require()
    runtime = cupy.cuda.runtime
    found = {"gpu": _device.device_name(), "tftrt_py": tftrt_py.__version__, "cupy": cupy.__version__,
             "cuda_runtime": runtime.runtimeGetVersion(), "cuda_driver": runtime.driverGetVersion(),
             "nvmath": _distribution("nvmath-python"), "triton": _distribution("triton")}
    cudnn = _device.cudnn_module()
    if cudnn is not None:
        found.update(cudnn=cudnn.backend_version(), cudnn_frontend=getattr(cudnn, "__version__", None))
    return found


#: Values in the host block a timing buffer repeats: random operands without device random kernels, which would be
#: compiled (seconds) on a machine's first build.
RANDOM_BLOCK = 1 << 20


@functools.lru_cache(maxsize=None)
def _random_block(dtype: str) -> np.ndarray:
    """RANDOM_BLOCK random values of `dtype` to time on: floats uniform in [-1, 1], int8 in [-127, 127] (quantized
    operands: never time on zeros), uint8 E4M3 codes (FP8 operands) without NaNs, bools even; zeros otherwise."""
    rng = np.random.default_rng(0)
    if dtype in ("float32", "float16"):
        return rng.uniform(-1.0, 1.0, RANDOM_BLOCK).astype(dtype)
    if dtype == "bool":
        return rng.uniform(0.0, 1.0, RANDOM_BLOCK) > 0.5
    if dtype == "int8":
        return rng.integers(-127, 128, RANDOM_BLOCK, dtype=np.int8)
    if dtype == "uint8":
        return (rng.integers(0, 0x7f, RANDOM_BLOCK) | (rng.integers(0, 2, RANDOM_BLOCK) << 7)).astype(np.uint8)
    return np.zeros(RANDOM_BLOCK, dtype)


class Tuner:
    def __init__(self, rc, options, check: bool = False):
        self.rc, self.options, self.check = rc, options, check
        self.chosen: Dict[str, dict] = {}
        self.report: List[dict] = []
        self.cache = options.timing_cache if options is not None else None
        self._context: Optional[TimingKey] = None  # the options and device parts of this tuner's cache keys
        self._buffers: Dict[tuple, object] = {}
        self._prebuilt: Dict[str, List[Op]] = {}  # layer signature -> candidates built ahead (prebuild)
        self._by_layer: Dict[Tuple[str, bool], dict] = {}  # (layer name, quantized) -> its tactic in this build
        self._busy_at = float("-inf")  # time.monotonic() when this tuner last timed something

    def release(self) -> None:
        if self._prebuilt:
            logger.debug("%d candidate sets built ahead went unused: %s", len(self._prebuilt), list(self._prebuilt))
        self._buffers.clear()
        self._prebuilt.clear()

    def prebuild(self, jobs) -> None:
        """Build the candidates of `jobs` ((spec, factory) pairs) side by side in threads, ahead of the choose()
        calls that time them: cuDNN plans (NVIDIA's frontend finalizes plans from several threads on one handle
        too) and kernels compile in parallel, one after another they take most of a fresh build. Nothing is timed
        meanwhile (a CUDA graph capture would see the other threads' allocations), and the specs whose tactic is
        recorded or cached are left to choose(), which builds only that one."""
        todo = self._unknown(jobs)
        if len(todo) < 2:
            return
        # Quantized candidates last: theirs wait on kernels the Triton compile process may still be compiling, and
        # a thread waiting on them would hold back the float candidates queued behind it.
        todo = dict(sorted(todo.items(), key=lambda item: item[1][0].quant is not None))
        device = _device.require().cuda.runtime.getDevice()
        start, seconds = time.perf_counter(), {}

        def build(spec, factory):
            began = time.perf_counter()
            try:
                return factory(spec)
            finally:
                seconds[spec.layer.name] = time.perf_counter() - began

        with concurrent.futures.ThreadPoolExecutor(min(PREBUILD_THREADS, len(todo)), "tftrt-prebuild",
                                                   _device.require().cuda.runtime.setDevice, (device,)) as pool:
            futures = {sig: pool.submit(build, spec, factory) for sig, (spec, factory) in todo.items()}
        for sig, future in futures.items():
            if future.exception() is None:  # else choose() builds it again and reports the failure
                self._prebuilt[sig] = future.result()
        logger.debug("built the candidates of %d layer(s) in %.2f s; slowest: %s", len(todo),
                     time.perf_counter() - start, sorted(((round(s, 2), n) for n, s in seconds.items()),
                                                         reverse=True)[:5])

    def warm(self, specs) -> None:
        """Compile the cuDNN plans of the candidates of `specs` whose tactic is not known in other processes
        (cudnn_warmup), while INT8 calibration runs: the build that follows finds their machine code in the
        driver's cache."""
        cudnn_warmup.warm([spec for spec, _ in self._unknown((spec, None) for spec in specs).values()])

    def _unknown(self, jobs) -> Dict[str, tuple]:
        """Signature -> (spec without a preferred tactic, factory) of each spec of `jobs` ((spec, factory) pairs)
        whose tactic is not known and whose candidates are not built already."""
        todo = {}
        for spec, factory in jobs:
            sig = spec.signature()
            if sig not in self._prebuilt and sig not in todo and not self.knows(spec):
                todo[sig] = (dataclasses.replace(spec, prefer=None), factory)
        return todo

    def tactic_of(self, layer_name: str, quantized: bool) -> Optional[dict]:
        """The tactic chosen for layer `layer_name` in this build (timed quantized or as a float layer), if any."""
        return self._by_layer.get((layer_name, quantized))

    def knows(self, spec: Spec) -> bool:
        """A tactic of `spec` is known without timing: recorded in the plan, chosen earlier in this build, or held
        by the timing cache."""
        sig = spec.signature()
        return spec.prefer is not None or sig in self.chosen or self._lookup(sig) is not None

    # -- buffers -----------------------------------------------------------------------------------
    def _buffer(self, shape, dtype, role: str):
        key = (tuple(shape), dtype, role)
        if key not in self._buffers:
            cupy = _device.require()
            with self.rc.stream:
                arr = cupy.empty(tuple(shape), dtype=dtype)
                flat, block = arr.reshape(-1), _random_block(dtype)
                for start in range(0, flat.size, block.size):  # the block repeated
                    part = flat[start:start + block.size]
                    part.set(block[:part.size], stream=self.rc.stream)
            self._buffers[key] = arr
        return self._buffers[key]

    # -- choice ------------------------------------------------------------------------------------
    def choose(self, spec: Spec, factory) -> Tuple[Op, dict]:
        sig = spec.signature()
        found = None if self.check else self._recorded(spec, sig, factory)
        if found is None and not self.check and sig not in self._prebuilt:
            found = self._of_this_layer(spec, sig, factory)
        if found is not None:
            self.chosen.setdefault(sig, found[1])
            self._by_layer[spec.layer.name, spec.quant is not None] = found[1]
            return found
        cands = self._prebuilt.pop(sig, None)
        if cands is None:
            cands = factory(dataclasses.replace(spec, prefer=None))
        if not cands:
            raise BackendError(f"no GPU implementation of {spec.layer.kind} layer {spec.layer.name!r} for these "
                               f"shapes and dtypes")
        fitting = [c for c in cands if c.workspace <= self.options.max_workspace]
        if not fitting:
            logger.warning("every tactic of %s needs more workspace than max_workspace_size (%d bytes); using "
                           "the smallest (%d bytes)", spec.layer.name, self.options.max_workspace,
                           min(c.workspace for c in cands))
            fitting = [min(cands, key=lambda c: c.workspace)]
        if len(fitting) == 1 and not self.check:
            record = dict(fitting[0].tactic, candidates=1)
        else:
            fitting = self._time_all(spec, fitting)
            record = dict(fitting[0].tactic, ms=round(fitting[0].ms, 5), candidates=len(cands))
        self.chosen[sig] = record
        self._by_layer[spec.layer.name, spec.quant is not None] = record
        self._remember(sig, record, spec.layer.name)
        return fitting[0], record

    def choose_chain(self, first: Spec, first_op: Op, second: Spec, second_op: Op, factory
                     ) -> Optional[Tuple[Op, dict]]:
        """(op, record) of the kernel running layers `first` and `second` as one step (`factory(first, second,
        prefer)` gives its candidates, ops/conv_chain.py) where it is faster than their own ops, `first_op` and
        `second_op` (timed on the same operands); None where it is not, where nothing chains them, or in check
        mode (its candidates are the layers' own). A plan's tactics decide without timing: the chain recorded under
        the first layer's "chain" key, or none; the timing cache holds both answers ("op" None: the layers apart).
        settings.CONV_CHAIN forces either answer."""
        force = settings.CONV_CHAIN.get()  # True: every pair that chains; False: none
        if self.check or force is False:
            return None
        if first.prefer is not None or second.prefer is not None:
            return self._rebuild_chain(first, second, factory, (first.prefer or {}).get("chain"))
        sig = json.dumps(["chain", first.signature(), second.signature()])
        cached = self.chosen.get(sig) or self._lookup(sig)
        if cached is not None:
            found = self._rebuild_chain(first, second, factory, cached) if cached.get("op") else None
            if found is not None or not cached.get("op"):
                self.chosen[sig] = cached
                return found
        try:  # a chain is an option: nothing that goes wrong with it fails the build
            cands = factory(first, second, None)
            apart = (self._apart_ms(first, first_op) + self._apart_ms(second, second_op)) if cands else None
        except Exception as exc:
            logger.info("%s + %s: no chain (%s)", first.layer.name, second.layer.name, exc)
            return None
        if not cands:
            return None
        chain = dataclasses.replace(first, out_shapes=first.out_shapes + second.out_shapes,
                                    out_dtypes=first.out_dtypes + second.out_dtypes)
        try:
            best = self._time_all(chain, cands)[0]
        except BackendError as exc:  # every chain kernel failed: the layers stay apart
            logger.debug("%s + %s: %s", first.layer.name, second.layer.name, exc)
            best = None
        if best is not None and (best.ms < apart or force):
            record = dict(best.tactic, ms=round(best.ms, 5), apart_ms=round(apart, 5), candidates=len(cands))
        else:
            record = {"op": None, "apart_ms": round(apart, 5), "ms": round(best.ms, 5) if best else None}
        logger.debug("%s + %s: chain %s ms, apart %.4f ms", first.layer.name, second.layer.name, record.get("ms"),
                     apart)
        self.chosen[sig] = record
        self._remember(sig, record, first.layer.name)
        return (best, record) if record["op"] else None

    def _apart_ms(self, spec: Spec, op: Op) -> float:
        self.rc.ensure_workspace(op.workspace)
        return self.op_ms(op, spec.in_shapes, spec.in_dtypes, spec.out_shapes, spec.out_dtypes)

    @staticmethod
    def _rebuild_chain(first: Spec, second: Spec, factory, prefer: Optional[dict]) -> Optional[Tuple[Op, dict]]:
        """(op, record) of the chain kernel `prefer` records, where it still builds; None without one."""
        if not prefer or not prefer.get("op"):
            return None
        try:
            cands = [c for c in factory(first, second, prefer) if _matches(c.tactic, prefer)]
        except Exception as exc:
            logger.debug("recorded chain of %s and %s failed to build: %s", first.layer.name, second.layer.name, exc)
            return None
        return (cands[0], {"candidates": 1, **prefer, **cands[0].tactic}) if cands else None

    def _of_this_layer(self, spec: Spec, sig: str, factory) -> Optional[Tuple[Op, dict]]:
        """(op, record) of the tactic that won for this layer earlier in this build under another signature, in the
        same precision, where it builds for `spec`; recorded under `sig` (without the time measured for the other
        signature). A quantized layer is timed with a quantized output while its precision is chosen, and writes
        floats in the program when a reader then runs in FP16: the other output costs the same few bytes for every
        candidate, so the tactic that won stays the choice, and timing every candidate again (compiling the
        kernels of every tile that format needs) is not repeated."""
        earlier = self._by_layer.get((spec.layer.name, spec.quant is not None))
        if earlier is None:
            return None
        found = self._rebuild(spec, factory, {k: v for k, v in earlier.items() if k not in ("ms", "candidates")})
        if found is not None:
            logger.debug("%s: tactic %s of this layer's earlier timing", spec.layer.name, found[1])
            self._remember(sig, found[1], spec.layer.name)
        return found

    def _recorded(self, spec: Spec, sig: str, factory) -> Optional[Tuple[Op, dict]]:
        """(op, record) of a recorded tactic that still builds: the plan's for this layer or this build's for the
        same signature, else the timing cache's; None where none does."""
        earlier = spec.prefer or self.chosen.get(sig)
        found = self._rebuild(spec, factory, earlier)
        if found is not None:
            return found
        if spec.prefer is not None:
            logger.info("tactic %s recorded for %s is not available on this GPU: re-tuning", spec.prefer,
                        spec.layer.name)
        cached = self._lookup(sig)
        if cached is None or cached == earlier:
            return None
        found = self._rebuild(spec, factory, cached)
        if found is None:
            logger.info("tactic %s of the timing cache for %s no longer builds here: timing its candidates", cached,
                        spec.layer.name)
        return found

    @staticmethod
    def _rebuild(spec: Spec, factory, prefer: Optional[dict]) -> Optional[Tuple[Op, dict]]:
        """(op, record) of the candidate matching the recorded tactic `prefer`, or None."""
        if prefer is None:
            return None
        try:
            cands = [c for c in factory(dataclasses.replace(spec, prefer=prefer)) if _matches(c.tactic, prefer)]
        except Exception as exc:
            logger.debug("recorded tactic for %s failed to build: %s", spec.layer.name, exc)
            return None
        # (the record keeps ms and notes like int8)
        return (cands[0], {"candidates": 1, **prefer, **cands[0].tactic}) if cands else None

    # -- the timing cache ------------------------------------------------------------------------------------
    def _key(self, what: str) -> Optional[TimingKey]:
        """The cache key of `what` (a layer signature, or an op's timing) under this tuner's options on this GPU;
        None without a cache."""
        if self.cache is None:
            return None
        if self._context is None:
            o = self.options
            options = {"allow_tf32": bool(o.allow_tf32), "strict_types": bool(o.strict_types),
                       "max_workspace": int(o.max_workspace),
                       "cudnn_plans": o.cudnn_plans, "cudnn_runtime_plans": o.cudnn_runtime_plans,
                       "triton_tiles": o.triton_tiles,
                       "gemm": settings.GEMM.raw(), "int8_conv": settings.INT8_CONV.raw(),
                       "fp8_conv": settings.FP8_CONV.raw()}
            if settings.CONV_CHAIN.raw() is not None:  # (a forced choice is kept apart from timed ones)
                options["conv_chain"] = settings.CONV_CHAIN.raw()
            self._context = TimingKey.of("", options, device_versions())
        return self._context._replace(layer=what)

    def _lookup(self, what: str) -> Optional[dict]:
        key = None if self.check else self._key(what)
        return self.cache.lookup(key) if key is not None else None

    def _remember(self, what: str, record: dict, name: str) -> None:
        key = self._key(what)
        if key is None:
            return
        try:
            self.cache.record(key, record)
        except TimingCacheError as exc:
            logger.warning("the timing cache cannot hold the tactic of %s: %s", name, exc)

    # -- timing ----------------------------------------------------------------------------------------------
    def fastest_ms(self, spec: Spec, factory) -> float:
        """Milliseconds of `spec`'s fastest tactic on this GPU (timed even when it is the only one). The timing
        cache's figure, where it holds one, answers without building the tactic (compiling its kernels): a
        precision choice only compares times."""
        sig = spec.signature()
        if spec.prefer is None and sig not in self.chosen:
            cached = self._lookup(sig)
            if cached is not None and type(cached.get("ms")) is float:
                return cached["ms"]
        op, record = self.choose(spec, factory)
        if record.get("ms") is None:
            record["ms"] = round(self._time_all(spec, [op])[0].ms, 5)
            if spec.prefer is None:
                self._remember(sig, record, spec.layer.name)
        return record["ms"]

    def op_ms(self, op: Op, in_shapes, in_dtypes, out_shapes, out_dtypes) -> float:
        """Milliseconds of one run of `op` on random operands of these shapes and dtypes (the timing cache's, where
        it holds them)."""
        what = json.dumps(["op", type(op).__name__, op.tactic, in_shapes, in_dtypes, out_shapes, out_dtypes],
                          sort_keys=True, default=str)
        cached = self._lookup(what)
        if cached is not None and type(cached.get("ms")) is float:
            return cached["ms"]
        ins, outs = self._io(in_shapes, in_dtypes, out_shapes, out_dtypes)
        ms = self._time(op, ins, outs)
        self._remember(what, {"ms": ms}, type(op).__name__)
        return ms

    def _io(self, in_shapes, in_dtypes, out_shapes, out_dtypes):
        return ([self._buffer(s, d, f"in{i}") for i, (s, d) in enumerate(zip(in_shapes, in_dtypes))],
                [self._buffer(s, d, f"out{i}") for i, (s, d) in enumerate(zip(out_shapes, out_dtypes))])

    def _time_all(self, spec: Spec, cands: List[Op]) -> List[Op]:
        ins, outs = self._io(spec.in_shapes, spec.in_dtypes, spec.out_shapes, spec.out_dtypes)
        self.rc.ensure_workspace(max(c.workspace for c in cands))
        ref = self._reference(spec, ins) if (self.check and spec.quant is None) else None  # int8: see tests
        timers = []
        for op in cands:
            try:
                timers.append((op, self._timer(op, ins, outs)))
            except Exception as exc:
                logger.debug("tactic %s of %s failed: %s", op.tactic, spec.layer.name, exc)
        timed = [op for op, _ in self._rounds(timers) if ref is None or self._agrees(spec, op, ins, outs, ref)]
        if not timed:
            raise BackendError(f"every tactic of {spec.layer.kind} layer {spec.layer.name!r} failed on this GPU "
                               f"(tried {[c.tactic for c in cands]})")
        timed.sort(key=lambda op: op.ms)
        logger.debug("%s: %s", spec.layer.name, [(op.tactic, round(op.ms, 4)) for op in timed])
        return timed

    def _time(self, op: Op, ins, outs) -> float:
        if not self._rounds([(op, self._timer(op, ins, outs))]):
            raise BackendError(f"tactic {op.tactic} failed while timed")
        return op.ms

    def _rounds(self, timers) -> list:
        """(op, timer) pairs whose timer ran in every round, each op's ``ms`` set to its median; the GPU
        warmed up first when it has been idle."""
        if timers and time.monotonic() - self._busy_at > IDLE_S:
            warm, deadline = 0.0, time.monotonic() + 0.2
            try:
                while warm < WARM_UP_MS and time.monotonic() < deadline:
                    warm += timers[0][1]() * INNER
            except Exception as exc:  # that candidate then fails in the rounds too
                logger.debug("warm-up with tactic %s failed: %s", timers[0][0].tactic, exc)
        times = {id(op): [] for op, _ in timers}
        alive = list(timers)
        for _ in range(ROUNDS):
            for op, timer in list(alive):
                try:
                    times[id(op)].append(timer())
                except Exception as exc:
                    logger.debug("tactic %s failed while timed: %s", op.tactic, exc)
                    alive.remove((op, timer))
        self._busy_at = time.monotonic()
        for op, _ in alive:
            op.ms = statistics.median(times[id(op)])
        return alive

    def _timer(self, op: Op, ins, outs):
        """A function timing one replay of INNER runs of `op` (ms per run), after one checked run. The raw kernels
        made since the last timing (this layer's candidates; every prebuilt layer's at the first timing) compile
        side by side first, instead of one after another as each is first launched."""
        cupy = _device.require()
        kernels.compile_pending()
        rc, stream = self.rc, self.rc.stream
        with stream:
            op.run(rc, ins, outs)
        stream.synchronize()
        graph = None
        if op.capturable:
            try:
                graph, keep = capture(stream, lambda: [op.run(rc, ins, outs) for _ in range(INNER)])
            except Exception as exc:
                logger.debug("could not capture %s for timing: %s", op.tactic, exc)
                graph = None
        start, end = cupy.cuda.Event(), cupy.cuda.Event()

        def timer() -> float:
            start.record(stream)
            if graph is not None:
                graph.launch(stream)
            else:
                with stream:
                    for _ in range(INNER):
                        op.run(rc, ins, outs)
            end.record(stream)
            end.synchronize()
            return cupy.cuda.get_elapsed_time(start, end) / INNER
        timer.keep = graph and keep  # the graph's memory lives as long as the timer
        return timer

    # -- check mode ------------------------------------------------------------------------------------
    def _reference(self, spec: Spec, ins):
        from tftrt_py.engine.reference import KERNELS

        host = []
        for x in ins:
            a = x.get(stream=self.rc.stream)
            host.append(a.astype(np.float32) if a.dtype == np.float16 else a)
        return [np.asarray(r, dtype=np.float64) for r in KERNELS[spec.layer.kind](spec.layer, host)]

    def _agrees(self, spec: Spec, op: Op, ins, outs, ref) -> bool:
        with self.rc.stream:
            op.run(self.rc, ins, outs)
        tol = 2e-2 if spec.cdt == "float16" else (5e-3 if self.options.allow_tf32 else 2e-4)
        ok = True
        for y, r in zip(outs, ref):
            got = y.get(stream=self.rc.stream).astype(np.float64)
            finite = np.isfinite(r)
            scale = max(1.0, float(np.max(np.abs(r[finite]))) if finite.any() else 1.0)
            good = bool(np.allclose(got, r, rtol=tol, atol=tol * scale, equal_nan=True))
            err = float(np.max(np.abs(got - r)[finite]) / scale) if finite.any() else 0.0
            self.report.append({"layer": spec.layer.name, "tactic": dict(op.tactic), "err": err, "ok": good})
            if not good:
                logger.warning("tactic %s of %s disagrees with the numpy backend (error %.3g of max(1, |ref|), "
                               "tolerance %.3g): dropped", op.tactic, spec.layer.name, err, tol)
                ok = False
        return ok
