"""How many threads a CPU backend may use, a cap on BLAS's threads while an engine runs, and work on large arrays
(weights cast or scanned while an engine builds) spread over that many threads.

An engine shares the process's cores with TensorFlow and whatever else runs there: a BLAS that spawns a
thread per core beside them oversubscribes the machine (a ResNet-18 engine took 326-904 ms per run instead
of 24-26 ms with one core held by another process). The count follows the process's own settings, first found:

1. ``TFTRT_PY_CPU_THREADS``;
2. ``OMP_NUM_THREADS``, ``OPENBLAS_NUM_THREADS``, ``MKL_NUM_THREADS``;
3. TensorFlow's intra-op setting, when TensorFlow is imported and it was set (never imported from here);
4. the CPUs this process may run on (its affinity mask).
"""
from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import os
import sys
import threading
from typing import Callable, Iterator, List, Optional, Sequence, TypeVar

from tftrt_py import settings

__all__ = ["THREADS_ENV", "LIBRARY_ENVS", "cpu_threads", "blas_limit", "map_arrays", "PARALLEL_BYTES"]

T = TypeVar("T")
R = TypeVar("R")

logger = logging.getLogger(__name__)

THREADS_ENV = settings.CPU_THREADS.name
LIBRARY_ENVS = tuple(s.name for s in (settings.OMP_NUM_THREADS, settings.OPENBLAS_NUM_THREADS,
                                      settings.MKL_NUM_THREADS))


def _tensorflow_threads() -> Optional[int]:
    """TensorFlow's intra-op thread count when TensorFlow is imported and it was set (0 means unset)."""
    tf = sys.modules.get("tensorflow")
    try:
        n = int(tf.config.threading.get_intra_op_parallelism_threads()) if tf is not None else 0
    except (AttributeError, RuntimeError, TypeError, ValueError):  # a partly imported or stubbed module
        return None
    return n if n > 0 else None


def _affinity_threads() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # no affinity masks on this platform
        return os.cpu_count() or 1


def cpu_threads() -> int:
    """How many threads a CPU backend may use (see the module's docstring for the order)."""
    for setting in (settings.CPU_THREADS, settings.OMP_NUM_THREADS, settings.OPENBLAS_NUM_THREADS,
                    settings.MKL_NUM_THREADS):
        n = setting.get()
        if n is not None:
            return n
    return _tensorflow_threads() or _affinity_threads()


class _BlasLimit:
    """One process-wide cap on BLAS's threads: the first run in sets it, the last one out gives BLAS its own
    setting back. BLAS's pool is the process's (OpenBLAS on pthreads), so concurrent engines share one cap, set
    from whichever thread comes first or last (threadpoolctl lets only one thread set OpenBLAS's count: each
    change here takes that role and hands it back)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._users = 0
        self._limiter = None
        self._controller = None

    def _change(self, change):
        from threadpoolctl import OpenBLASController

        clear = getattr(OpenBLASController, "clear_controlling_thread", None)
        if clear is None:  # threadpoolctl < 3.8 (an older one installed beside us): changes from other threads
            return change()  # may not take, but the run goes on
        clear(force=True)
        try:
            return change()
        finally:
            clear(force=True)

    @contextlib.contextmanager
    def __call__(self, threads: Optional[int] = None) -> Iterator[int]:
        with self._lock:
            n = threads or cpu_threads()
            if self._users == 0:
                if self._controller is None:  # finds the BLAS libraries loaded, once
                    from threadpoolctl import ThreadpoolController

                    self._controller = ThreadpoolController().select(user_api="blas")
                self._limiter = self._change(lambda: self._controller.limit(limits=n))
            self._users += 1
        try:
            yield n
        finally:
            with self._lock:
                self._users -= 1
                if self._users == 0:
                    self._change(self._limiter.restore_original_limits)
                    self._limiter = None


#: ``with blas_limit():`` caps BLAS's threads at cpu_threads() (or the count given) inside the block.
blas_limit = _BlasLimit()


#: Array work on up to this many bytes in all runs on the calling thread; more in cpu_threads() threads.
PARALLEL_BYTES = 32 << 20


def map_arrays(fn: Callable[[T], R], items: Sequence[T], nbytes: int, name: str,
               initializer: Optional[Callable[..., object]] = None, initargs: tuple = ()) -> List[R]:
    """``[fn(item) for item in items]``, in cpu_threads() threads named `name` (each first running `initializer`)
    where the arrays it reads hold more than PARALLEL_BYTES in all (`nbytes`): numpy releases the GIL while it
    casts and reduces, and a transformer's weights (keras-hub BERT-base: 0.44 GB) take a second to round to fp16
    on one core."""
    workers = min(cpu_threads(), len(items)) if nbytes > PARALLEL_BYTES else 1
    if workers <= 1:
        return [fn(item) for item in items]
    with concurrent.futures.ThreadPoolExecutor(workers, name, initializer, initargs) as pool:
        return list(pool.map(fn, items))
