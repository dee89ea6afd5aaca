"""BatchScheduler's interface on Ray Serve's `@serve.batch`: Ray collects requests (up to max_batch_size rows,
waiting at most batch_timeout_micros for the first), then each signature's compatible requests in a collection
run as one padded batch, as ours do (batching.run_batch). Needs `ray[serve]` (the `ray` extra)."""
from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import dataclasses
import threading
from typing import Callable, Dict, Hashable, List, Mapping, Optional

import numpy as np

from tftrt_py.serving.batching import RunFn, batch_key, batch_rows, run_batch, serving_error
from tftrt_py.serving.config import BatchingOptions
from tftrt_py.serving.errors import Code, ServingError

__all__ = ["RayBatchScheduler"]


@dataclasses.dataclass
class _Request:
    queue_id: Hashable
    run: RunFn
    arrays: Mapping[str, np.ndarray]
    size: int
    label: str


class RayBatchScheduler:
    """Requests batched by `ray.serve.batch` on an event loop of its own; batches run on num_batch_threads
    threads (Ray's max_concurrent_batches). More than max_enqueued_batches * max_batch_size waiting rows: the
    request is refused (UNAVAILABLE), as by a full queue of ours."""

    def __init__(self, options: BatchingOptions, on_batch: Optional[Callable[[str, int, int], None]] = None):
        from ray import serve

        self.options = options
        self._on_batch = on_batch
        self._waiting: Dict[str, int] = collections.Counter()  # rows submitted, not yet answered, by label
        self._pending: Dict[concurrent.futures.Future, _Request] = {}
        self._lock = threading.Lock()
        self._stopped = False
        self._pool = concurrent.futures.ThreadPoolExecutor(options.num_batch_threads,
                                                           thread_name_prefix="tftrt-ray-batch")
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="tftrt-ray-batch-loop", daemon=True)
        self._thread.start()
        self._batched = serve.batch(max_batch_size=options.max_batch_size,
                                    batch_wait_timeout_s=options.batch_timeout_micros / 1e6,
                                    max_concurrent_batches=options.num_batch_threads,
                                    batch_size_fn=lambda requests: sum(r.size for r in requests))(self._run_requests)

    def submit(self, queue_id: Hashable, run: RunFn, arrays: Mapping[str, np.ndarray], label: str = "",
               loop: Optional[asyncio.AbstractEventLoop] = None):
        """A future of `run`'s outputs for `arrays` alone, computed in a batch with other requests to `queue_id`:
        with `loop` (the caller's running loop), an asyncio future of that loop, else a concurrent one."""
        request = _Request(queue_id, run, arrays, batch_rows(arrays, self.options.max_batch_size), label)
        future = concurrent.futures.Future()
        with self._lock:
            if self._stopped:
                raise ServingError(Code.UNAVAILABLE, "the server is shutting down")
            if sum(self._waiting.values()) + request.size > self.options.max_enqueued_batches * \
                    self.options.max_batch_size:
                raise ServingError(Code.UNAVAILABLE, "The batch scheduling queue to which this task was submitted "
                                                     "is full")
            self._waiting[label] += request.size
            self._pending[future] = request
        asyncio.run_coroutine_threadsafe(self._one(request, future), self._loop)
        return future if loop is None else asyncio.wrap_future(future, loop=loop)

    def queue_depths(self) -> Dict[str, int]:
        """Rows submitted and not yet answered, by label."""
        with self._lock:
            return {label: rows for label, rows in self._waiting.items() if rows}

    def stop(self) -> None:
        """Fail the requests not yet answered (UNAVAILABLE), then stop the loop and the batch threads."""
        with self._lock:
            self._stopped = True
            pending = list(self._pending)
        for future in pending:
            self._answer(future, ServingError(Code.UNAVAILABLE, "the server is shutting down"))
        asyncio.run_coroutine_threadsafe(self._cancel_tasks(), self._loop).result()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()
        self._pool.shutdown(wait=True)

    def _answer(self, future: concurrent.futures.Future, result) -> None:
        with self._lock:
            request = self._pending.pop(future, None)
            if request is None:  # answered already (the server stopped)
                return
            self._waiting[request.label] -= request.size
        if isinstance(result, Exception):
            future.set_exception(result)
        else:
            future.set_result(result)

    async def _one(self, request: _Request, future: concurrent.futures.Future) -> None:
        try:
            result = await self._batched(request)
        except Exception as exc:  # Ray's own failures; the batch's are in `result`
            result = serving_error(exc)
        self._answer(future, result)

    @staticmethod
    async def _cancel_tasks() -> None:
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _run_requests(self, requests: List[_Request]) -> list:
        return await self._loop.run_in_executor(self._pool, self._run_groups, requests)

    def _run_groups(self, requests: List[_Request]) -> list:
        """Each request's outputs (or its error): requests to one queue with one batch_key run as one batch."""
        groups = collections.defaultdict(list)
        for i, request in enumerate(requests):
            groups[request.queue_id, batch_key(request.arrays)].append(i)
        results: list = [None] * len(requests)
        for indices in groups.values():
            group = [requests[i] for i in indices]
            rows = sum(r.size for r in group)
            padded = self.options.padded_size(rows)
            if self._on_batch is not None:
                self._on_batch(group[0].label, rows, padded)
            try:
                outputs = run_batch(group[0].run, [r.arrays for r in group], padded)
            except Exception as exc:  # every request of the batch gets the error
                outputs = [serving_error(exc)] * len(group)
            for i, output in zip(indices, outputs):
                results[i] = output
        return results
