"""Execution contexts by batch: a row-wise engine serves a small batch at (about) its own size.

A row-wise engine built for B rows serves any batch up to B, but its kernels run all B rows: a batch-1 request
served by a batch-512 engine costs the batch-512 time. TensorRT's implicit batch runs the rows it is given.
Here, a batch b no more than half the engine's gets a copy of the engine built for the next power of two
(``Engine.for_batch``: the same optimized network re-batched, compiled by the same backend) the first time such a
batch arrives; then batches up to the bucket are padded to it, and a request costs at most about twice its own
rows. On the CPU that first request waits for the copy: making ONNX Runtime sessions costs less than running the
engine's whole batch (Keras ResNet50 at 64x64: a batch-512 run takes seconds). On a GPU a build tunes kernels
(seconds) while a padded run takes milliseconds, so the copy is built in a background thread and the engine
serves such batches padded until it is ready. The copies belong to the engine's cache entry: they take no cache
slot (``maximum_cached_engines`` keeps TF-TRT's meaning), are not saved with the model (they are made again on
demand) and go with the entry.
"""
from __future__ import annotations

import logging
import threading
from typing import Dict, Optional

from tftrt_py.engine_op.pool import ContextPool

__all__ = ["BatchBuckets", "serving_pool", "bucket_for"]

logger = logging.getLogger(__name__)


def bucket_for(batch: int, engine_batch: int) -> int:
    """The batch a request of `batch` rows runs at: the next power of two, or the engine's own batch when that
    is no more than twice the request."""
    bucket = 1 << max(0, batch - 1).bit_length()
    return engine_batch if bucket * 2 > engine_batch else bucket


class BatchBuckets:
    """The contexts of a row-wise `engine` and of its copies for smaller batches (see the module docstring)."""

    def __init__(self, engine):
        self.engine = engine
        self._wait = engine.device == "cpu"  # see the module docstring
        self._pools: Dict[int, ContextPool] = {engine.max_batch_size: ContextPool(engine)}
        self._failed: Dict[int, str] = {}
        self._building: Dict[int, threading.Thread] = {}
        self._profiler = None
        self._lock = threading.Lock()

    @property
    def copies(self) -> int:
        """The copies built for smaller batches."""
        return len(self._pools) - 1

    @property
    def replays(self) -> bool:
        return self._pools[self.engine.max_batch_size].replays

    def __len__(self) -> int:
        return sum(len(pool) for pool in list(self._pools.values()))

    def context_for(self, shapes) -> ContextPool:
        """The pool serving input `shapes` (their batch is at most the engine's): the copy for the batch's bucket,
        its build started when none was tried (and waited for on the CPU), else the engine's own (padding)."""
        batch = shapes[0][0] if shapes and shapes[0] else self.engine.max_batch_size
        bucket = bucket_for(batch, self.engine.max_batch_size)
        pool = self._pools.get(bucket)
        if pool is not None:
            return pool
        with self._lock:
            if bucket not in self._building and bucket not in self._failed and bucket not in self._pools:
                thread = threading.Thread(target=self._build, args=(bucket,), daemon=True,
                                          name=f"tftrt-batch-{bucket}-{self.engine.name}")
                self._building[bucket] = thread
                thread.start()
            thread = self._building.get(bucket)
        if thread is not None and self._wait:
            thread.join()
        return self._pools.get(bucket) or self._pools[self.engine.max_batch_size]

    def pending(self, shapes) -> bool:
        """Whether the copy that will serve `shapes` is still being built (their calls run padded meanwhile)."""
        batch = shapes[0][0] if shapes and shapes[0] else self.engine.max_batch_size
        return bucket_for(batch, self.engine.max_batch_size) in self._building

    def wait(self, timeout: Optional[float] = None) -> None:
        """Return when the builds started so far have ended (or `timeout` seconds passed)."""
        with self._lock:
            threads = list(self._building.values())
        for thread in threads:
            thread.join(timeout)

    def _build(self, bucket: int) -> None:
        try:
            copy = self.engine.for_batch(bucket)
            pool = ContextPool(copy)
        except Exception as exc:  # e.g. params that fix the batch: the engine's own pool keeps serving, padded
            with self._lock:
                self._failed[bucket] = f"{type(exc).__name__}: {exc}"
                del self._building[bucket]
            logger.info("engine %r: no copy for batch %d (%s); such batches run padded to %d", self.engine.name,
                        bucket, self._failed[bucket], self.engine.max_batch_size)
            return
        with self._lock:
            pool.profiler = self._profiler
            self._pools[bucket] = pool
            del self._building[bucket]
        logger.info("engine %r: a copy for batch %d serves batches up to %d", self.engine.name, bucket, bucket)

    def execute_v2(self, inputs, outputs=None) -> list:
        return self.context_for([a.shape for a in inputs]).execute_v2(inputs, outputs)

    @property
    def profiler(self):
        return self._profiler

    @profiler.setter
    def profiler(self, profiler) -> None:
        with self._lock:
            self._profiler = profiler
            for pool in self._pools.values():
                pool.profiler = profiler


def serving_pool(engine):
    """The contexts serving `engine`: by batch bucket for a row-wise engine of more than one row, else one pool."""
    return BatchBuckets(engine) if engine.rowwise and engine.max_batch_size > 1 else ContextPool(engine)
