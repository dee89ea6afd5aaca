"""A pool of execution contexts for one engine, so concurrent callers run at once.

TensorRT's best practices: one execution context (with its stream and buffers) per thread; the
weights are the engine's and shared. A TRTEngineOp served from several threads takes an idle
context for each call, making a new one while fewer than ``TFTRT_PY_CONTEXTS_PER_ENGINE`` (default 4)
exist, else waiting for one to come back (a context that cannot be made, e.g. for want of GPU memory,
caps the pool at those it has). A single caller only ever uses the first.
"""
from __future__ import annotations

import logging
import os
import threading
from typing import List, Optional, Sequence

__all__ = ["ContextPool", "CONTEXTS_ENV", "contexts_per_engine"]

logger = logging.getLogger(__name__)

CONTEXTS_ENV = "TFTRT_PY_CONTEXTS_PER_ENGINE"


def contexts_per_engine() -> int:
    value = os.environ.get(CONTEXTS_ENV, "4")
    try:
        return max(1, int(value))
    except ValueError:
        logger.error("%s=%r is not a whole number; using 4 execution contexts per engine", CONTEXTS_ENV, value)
        return 4


class ContextPool:
    """Execution contexts of `engine`; ``execute_v2`` runs a call on an idle one."""

    def __init__(self, engine, size: Optional[int] = None):
        self.engine = engine
        self.size = size or contexts_per_engine()
        first = engine.create_execution_context()  # the first now: a context that cannot be made fails here
        self._all: List[object] = [first]
        self._idle: List[object] = [first]
        self._making = 0
        self._cond = threading.Condition()
        self._profiler = None

    def __len__(self) -> int:
        return len(self._all)

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

    @property
    def profiler(self):
        return self._profiler

    @profiler.setter
    def profiler(self, profiler) -> None:
        with self._cond:
            self._profiler = profiler
            for context in self._all:
                context.profiler = profiler
