"""The Python side of the TRTEngineOp kernel: its entry points, and which engine op each kernel uses and for how long.

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

import contextlib
import itertools
import logging
import threading
from typing import Callable, Dict, List, Optional, Tuple

import numpy as np
from tensorflow.core.framework import function_pb2, node_def_pb2

from tftrt_py.convert.rewrite import ALLOW_BUILD_ATTR
from tftrt_py.engine.types import QUANTIZED
from tftrt_py.engine_op.binding import segment_binding
from tftrt_py.engine_op.op import EngineOp

__all__ = ["create", "run", "replay", "release", "warn", "pin", "engine_ops", "wait_for_builds", "find", "stats",
           "start_collecting", "stop_collecting", "start_calibrating", "finish_calibrating"]

logger = logging.getLogger(__name__)


_OPS: Dict[tuple, EngineOp] = {}  # (segment key, segment function name, binding) -> op
#: segment key -> the op created last for it: what find() gives the converter; while the key is pinned the op
#: outlives its kernels (a converter's function rebuilt: kernels released, then created again)
_LATEST: Dict[str, EngineOp] = {}
_PINS: Dict[str, int] = {}  # segment key -> pins held (see pin)
_USERS: Dict[int, int] = {}  # id(op) -> kernels holding it
_HANDLES: Dict[int, Tuple[EngineOp, bool]] = {}
_COUNTER = itertools.count(1)
_LOCK = threading.RLock()
_HELD = threading.local()  # depth: how many _locked() blocks this thread is in
_DEFERRED: List[int] = []  # handles released while their thread was inside a _locked() block (see release)
_COLLECTING: Dict[str, List[tuple]] = {}  # segment key -> input shapes seen while collecting (ops share the list)
_CALIBRATING: Dict[str, Optional[str]] = {}  # segment key of an op not created yet -> its calibrator (None: default)
_TIMING: Dict[str, object] = {}  # pinned segment key -> the timing cache its engines build with (see pin)
_WEIGHTS: Dict[str, dict] = {}  # pinned segment key -> its op's weight input values (see pin)


def _text(key) -> str:
    return key.decode() if isinstance(key, bytes) else str(key)


def start_collecting(segment_key: str) -> None:
    """Until stop_collecting, the op of `segment_key` records its input shapes and runs its native segment."""
    with _locked():
        collected = _COLLECTING[_text(segment_key)] = []
        ops = [op for op in _OPS.values() if _text(op.segment_key) == _text(segment_key)]
    for op in ops:
        op.collecting = collected
        op.revoke_replays()


def stop_collecting(segment_key: str) -> List[tuple]:
    """The distinct input shapes (one tuple per input) recorded since start_collecting, in arrival order."""
    with _locked():
        collected = _COLLECTING.pop(_text(segment_key), [])
        for op in _OPS.values():
            if op.collecting is collected:
                op.collecting = None
    return collected


def start_calibrating(segment_key: str, algorithm: Optional[str] = None) -> None:
    """The op of `segment_key` (now, or once it is created) calibrates with `algorithm` (None: its precision's
    default) until finish_calibrating."""
    key = _text(segment_key)
    with _locked():
        op = _LATEST.get(key)
        if op is None:
            _CALIBRATING[key] = algorithm
    if op is not None:
        op.revoke_replays()
        op.calibration.start(algorithm)


def finish_calibrating(segment_key: str) -> bytes:
    """The calibration table of the op of `segment_key` (b"" when it never ran); see EngineOp.calibration_table."""
    key = _text(segment_key)
    with _locked():
        _CALIBRATING.pop(key, None)
        op = _LATEST.get(key)
    if op is None:
        logger.warning("Warning calibration error for %s: it never ran during calibration", key)
        return b""
    return op.calibration_table()


@contextlib.contextmanager
def _locked():
    """Hold the registry's lock. The garbage collector may run a finalizer at any allocation inside, and a
    finalizer may drop a function whose kernels then call release: on this thread that release waits until the
    outermost block ends, so no change to the registry lands half-way through another."""
    with _LOCK:
        depth = getattr(_HELD, "depth", 0)
        _HELD.depth = depth + 1
        try:
            yield
        finally:
            while depth == 0 and _DEFERRED:
                _release(_DEFERRED.pop())
            _HELD.depth = depth


def create(node_def: bytes, function_def: bytes, callees: bytes = b"") -> int:
    node = node_def_pb2.NodeDef.FromString(node_def)
    segment_key = node.attr["segment_key"].s.decode() or node.name
    func = function_pb2.FunctionDef.FromString(function_def).signature.name if function_def else ""
    key = (segment_key, func, segment_binding(node, function_def, callees))
    with _locked():
        op = _OPS.get(key)
        latest = _LATEST.get(segment_key)
        if op is None and latest is not None and latest.key == key:  # the converter's op, its function rebuilt
            op = _OPS[key] = latest
        calibration_data = node.attr["calibration_data"].s if "calibration_data" in node.attr else b""
        if op is None:
            op = _OPS[key] = _LATEST[segment_key] = EngineOp(node, function_def, callees, binding=key[2])
            op.key = key
            op.timing_cache = _TIMING.get(segment_key)
            if segment_key in _WEIGHTS:
                op.bind_weights(_WEIGHTS[segment_key])
            op.collecting = _COLLECTING.get(segment_key)
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
    return op.serve(inputs, assets, allow_build, allocate)


def replay(handle: int, inputs):
    """A native replay for the kernel of `handle` at `inputs` (as for run): (its packed form, the replay, which
    the kernel keeps alive while it holds it), None (not now) or False (never for this op)."""
    op, _ = _HANDLES[handle]
    found = op.native_replay(op.arrays(inputs))
    return (found.pack(), found) if found else found


def warn(message: str) -> None:
    logger.warning("%s", message)


def release(handle: int) -> None:
    """A kernel is destroyed: its op goes (engines and all) with the last kernel holding it."""
    with _locked():
        if _HELD.depth > 1:  # a finalizer inside another _locked() block of this thread
            _DEFERRED.append(handle)
        else:
            _release(handle)


def _release(handle: int) -> None:
    """release(handle), _LOCK held."""
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


def pin(segment_keys, timing_cache=None, weights=None) -> Callable[[], None]:
    """Keep the ops of `segment_keys` (now and created later) alive while no kernel holds them, until the function
    returned is called (once; a converter calls it when it is dropped). Meanwhile their engines build with
    `timing_cache` (a BuilderConfig.timing_cache: None for the process's default), and an op with weight inputs
    takes `weights[segment key]` (input index -> its variable's read) as their values instead of copying them
    from its first run."""
    keys = [_text(k) for k in segment_keys]
    weights = {_text(k): v for k, v in (weights or {}).items()}
    with _locked():
        for key in keys:
            _PINS[key] = _PINS.get(key, 0) + 1
            _TIMING[key] = timing_cache
            if key in weights:
                _WEIGHTS[key] = weights[key]
            if key in _LATEST:
                _LATEST[key].timing_cache = timing_cache
                if key in weights:
                    _LATEST[key].bind_weights(weights[key])
    done = []

    def unpin() -> None:
        with _locked():
            if done:
                return
            done.append(True)
            for key in keys:
                _PINS[key] -= 1
                if _PINS[key]:
                    continue
                del _PINS[key]
                _TIMING.pop(key, None)
                _WEIGHTS.pop(key, None)
                op = _LATEST.get(key)
                if op is not None and id(op) not in _USERS:
                    del _LATEST[key]
    return unpin


def engine_ops() -> Dict[tuple, EngineOp]:
    """Every engine op alive in this process, by (segment key, segment function name, binding)."""
    with _locked():
        return dict(_OPS)


def wait_for_builds(timeout: Optional[float] = None) -> None:
    """Return when every live engine op's background builds started so far have ended (see
    EngineOp.wait_for_builds): what a server waits for after replaying warm-up requests."""
    for op in engine_ops().values():
        op.wait_for_builds(timeout)


def find(segment_key: str) -> Optional[EngineOp]:
    """The op created last for `segment_key` (the converter's: its keys are fresh per conversion)."""
    with _locked():
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
