"""A pool of execution contexts for one engine, so concurrent callers run at once.

TensorRT's best practices: one execution context (with its stream and buffers) per thread; the
weights are the engine's and shared. A TRTEngineOp served from several threads takes an idle
context for each call, making a new one while fewer than ``TFTRT_PY_CONTEXTS_PER_ENGINE`` (default 4)
exist, else waiting for one to come back (a context that cannot be made, e.g. for want of GPU memory,
caps the pool at those it has). A single caller only ever uses the first.

Contexts can also be exported as native replays (engine.replay) that the kernel runs without Python: up to
``size`` per input shapes, each an idle context taken out of the pool (the pool makes another if Python's calls
need one) or a new one; an exported context is never used from Python again.
"""
from __future__ import annotations

import logging
import threading
import weakref
from typing import Dict, List, Optional, Sequence

from tftrt_py import settings

__all__ = ["ContextPool", "CONTEXTS_ENV", "contexts_per_engine"]

logger = logging.getLogger(__name__)

CONTEXTS_ENV = settings.CONTEXTS.name


def contexts_per_engine() -> int:
    """CONTEXTS_ENV, else 4 (a malformed value is logged)."""
    return settings.CONTEXTS.get()


class ContextPool:
    """Execution contexts of `engine`; ``execute_v2`` runs a call on an idle one."""

    def __init__(self, engine, size: Optional[int] = None):
        self.engine = engine
        self.size = size or contexts_per_engine()
        first = engine.create_execution_context()  # the first now: a context that cannot be made fails here
        self.replays: bool = getattr(first, "replays", False)  # whether the backend offers native replays
        self._all: List[object] = [first]
        self._idle: List[object] = [first]
        self._making = 0
        self._exported: Dict[tuple, weakref.WeakSet] = {}  # input shapes -> the native replays made of them
        self._export_lock = threading.Lock()
        self._cond = threading.Condition()
        self._profiler = None

    def __len__(self) -> int:
        return len(self._all)

    def context_for(self, shapes) -> "ContextPool":
        """The pool serving `shapes`: this one (see buckets.BatchBuckets for an entry holding several)."""
        return self

    def pending(self, shapes) -> bool:
        """Whether a better pool for `shapes` is being built (never, for a single pool)."""
        return False

    def wait(self, timeout: Optional[float] = None) -> None:
        """Return when the builds of better pools started so far have ended (none, for a single pool)."""

    @property
    def copies(self) -> int:
        """Copies of the engine for smaller batches (none, for a single pool)."""
        return 0

    def call(self):
        """The engine's :meth:`ExecutionContext.call` (through the first context: a call needs none of its own), or
        None where its backend offers none."""
        with self._cond:
            first = self._all[0] if self._all else None
        return None if first is None else first.call()

    def _acquire(self):
        while True:
            with self._cond:
                while not self._idle and len(self._all) + self._making >= self.size:
                    self._cond.wait()
                if self._idle:
                    return self._idle.pop()
                self._making += 1
            try:  # made outside the lock: the other contexts keep serving meanwhile
                context = self.engine.create_execution_context()
                context.profiler = self._profiler
            except Exception as exc:  # e.g. out of memory: the pool stays at the contexts it has
                with self._cond:
                    self._making -= 1
                    self.size = len(self._all)
                    self._cond.notify_all()
                logger.warning("engine %r: no further execution context (%s); %d serve its callers in turn",
                               self.engine.name, exc, self.size)
                continue
            with self._cond:
                self._making -= 1
                self._all.append(context)
            logger.debug("engine %r: execution context %d of at most %d", self.engine.name, len(self._all),
                         self.size)
            return context

    def _release(self, context) -> None:
        with self._cond:
            self._idle.append(context)
            self._cond.notify()

    def execute_v2(self, inputs: Sequence, outputs=None) -> list:
        """ExecutionContext.execute_v2 on an idle context (waiting for one when all are busy)."""
        context = self._acquire()
        try:
            return context.execute_v2(inputs, outputs)
        finally:
            self._release(context)

    def export(self, inputs: Sequence, out_dtypes: Sequence):
        """An execution context as a native replay at the shapes of `inputs` (engine.replay), or None: the backend
        offers none, ``size`` replays that are not revoked exist for these shapes already, or the engine cannot be
        replayed (then :attr:`replays` turns False)."""
        from tftrt_py.engine.replay import ENABLED

        shapes = tuple(tuple(a.shape) for a in inputs)
        if not self.replays:
            return None
        with self._export_lock:  # rare (once per context and shapes): one at a time keeps the count right
            live = self._exported.setdefault(shapes, weakref.WeakSet())
            if sum(1 for r in list(live) if r.state[ENABLED]) >= self.size:
                return None
            with self._cond:
                context = self._idle.pop() if self._idle else None
                if context is not None:
                    self._all.remove(context)
            replay = None
            try:
                if context is None:
                    context = self.engine.create_execution_context()
                replay = context.native_replay(inputs, out_dtypes)
                if replay is None:  # not one CUDA graph, other dtypes: no context of this engine will do
                    self.replays = False
            except Exception as exc:  # e.g. out of memory: the calls keep running through Python
                logger.warning("engine %r: no native replay for %s (%s: %s)", self.engine.name, list(shapes),
                               type(exc).__name__, exc)
            if replay is None:
                if context is not None:
                    with self._cond:
                        self._all.append(context)
                        self._idle.append(context)
                        self._cond.notify()
                return None
            replay.limit = self.size
            live.add(replay)
            return replay

    @property
    def profiler(self):
        return self._profiler

    @profiler.setter
    def profiler(self, profiler) -> None:
        with self._cond:
            self._profiler = profiler
            for context in self._all:
                context.profiler = profiler
