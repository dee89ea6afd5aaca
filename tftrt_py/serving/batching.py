"""Dynamic batching as TF Serving's shared batch scheduler does it: requests to one signature queue up in
batches (only requests with equal dtypes and non-batch dimensions share one), a batch runs when full or when its
oldest request has waited batch_timeout_micros and a batch thread is free, is padded up to the next allowed batch
size with copies of its first row, and its outputs are split back to the requests row for row. A request's rows are
copied into its batch's input arrays when it is submitted (batch_buffers), so the batch thread only runs the model
on them. A queue holding max_enqueued_batches batches refuses more (UNAVAILABLE) instead of growing. Callers
awaiting on an event loop get their batch's answers by one callback on that loop (one wake-up per batch, not one
per request)."""
from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging
import threading
import time
from concurrent.futures import Future, InvalidStateError
from typing import Callable, Deque, Dict, Hashable, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

from tftrt_py.serving.batch_buffers import BufferPool, aligned_empty, copy_rows, pad_rows
from tftrt_py.serving.config import BatchingOptions
from tftrt_py.serving.errors import Code, ServingError

logger = logging.getLogger(__name__)

__all__ = ["BatchScheduler", "RunFn", "batch_rows", "batch_key", "deliver", "run_batch", "run_rows", "serving_error"]

#: a model's outputs for a batch's inputs, which are valid during the call only (the next batch reuses them)
RunFn = Callable[[Mapping[str, np.ndarray]], Dict[str, np.ndarray]]


@dataclasses.dataclass
class _Task:
    size: int
    future: Union[Future, asyncio.Future]
    loop: Optional[asyncio.AbstractEventLoop]  # the loop of an asyncio future; None: a concurrent one


def _settle(future: Union[Future, asyncio.Future], answer) -> None:
    """Set `future` to `answer` (an exception: raised by it), unless its caller gave up on it (cancelled)."""
    if isinstance(future, asyncio.Future) and future.done():
        return
    try:
        if isinstance(answer, BaseException):
            future.set_exception(answer)
        else:
            future.set_result(answer)
    except InvalidStateError:  # cancelled meanwhile
        pass


def _settle_all(answers: List[Tuple[asyncio.Future, object]]) -> None:
    for future, answer in answers:
        _settle(future, answer)


def deliver(answers: Iterable[Tuple[object, object]]) -> None:
    """Each (waiter, answer) pair's answer, where a waiter has a `future` and the `loop` of an asyncio future
    (None: a concurrent future): a concurrent future is set here, the asyncio futures of each loop by one callback
    on that loop (one wake-up of a loop per batch, not one per request)."""
    by_loop: Dict[asyncio.AbstractEventLoop, list] = collections.defaultdict(list)
    for waiter, answer in answers:
        if waiter.loop is None:
            _settle(waiter.future, answer)
        else:
            by_loop[waiter.loop].append((waiter.future, answer))
    for loop, pairs in by_loop.items():
        try:
            loop.call_soon_threadsafe(_settle_all, pairs)
        except RuntimeError:  # the loop is closed: nobody awaits its futures
            pass


@dataclasses.dataclass
class _Batch:
    key: tuple  # what merging needs equal: input names, dtypes, non-batch dims
    deadline: float
    inputs: Dict[str, np.ndarray]  # max_batch_size rows per input name; the tasks' rows, in order, from row 0
    tasks: List[_Task] = dataclasses.field(default_factory=list)
    size: int = 0
    closed: bool = False
    copying: int = 0  # tasks whose rows are still being copied into `inputs`: the batch cannot run yet

    def ready(self, now: float) -> bool:
        return (self.closed or self.deadline <= now) and not self.copying


@dataclasses.dataclass
class _Queue:
    run: RunFn
    label: str  # the model name, for metrics
    batches: Deque[_Batch] = dataclasses.field(default_factory=collections.deque)


def batch_rows(arrays: Mapping[str, np.ndarray], max_batch_size: int) -> int:
    """The rows of a request to be batched: its inputs' common 0th dimension, 1 to max_batch_size."""
    sizes = {a.shape[0] if a.ndim else None for a in arrays.values()}
    if len(sizes) != 1 or None in sizes:
        raise ServingError(Code.INVALID_ARGUMENT, "Batching session Run() input tensors must have equal "
                                                  "0th-dimension size (and rank >= 1)")
    size = sizes.pop()
    if size == 0:
        raise ServingError(Code.INVALID_ARGUMENT, "a request with 0 rows cannot be batched")
    if size > max_batch_size:
        raise ServingError(Code.INVALID_ARGUMENT, f"Task size {size} is larger than maximum input batch size "
                                                  f"{max_batch_size}")
    return size


def batch_key(arrays: Mapping[str, np.ndarray]) -> tuple:
    """What requests sharing a batch need equal: input names, dtypes and non-batch dimensions."""
    return tuple(sorted((n, a.dtype, a.shape[1:]) for n, a in arrays.items()))


def run_rows(run: RunFn, inputs: Mapping[str, np.ndarray], sizes: Sequence[int]) -> List[Dict[str, np.ndarray]]:
    """Each request's outputs of one `run` over `inputs`, the requests' rows merged (`sizes` rows each, in order)
    and padded. No output views `inputs` (a copy replaces one that does): the next batch may reuse them."""
    padded = len(next(iter(inputs.values())))
    outputs = run(inputs)
    for name, value in outputs.items():
        if value.ndim == 0 or value.shape[0] != padded:
            raise ServingError(Code.FAILED_PRECONDITION, f"Batched output tensor {name!r} has shape "
                                                         f"{list(value.shape)}: its 0th dimension is not the "
                                                         f"batch's size {padded}; the signature cannot be batched")
    outputs = {k: v.copy() if any(np.may_share_memory(v, a) for a in inputs.values()) else v
               for k, v in outputs.items()}
    starts = np.cumsum([0, *sizes])
    return [{k: v[start:start + size] for k, v in outputs.items()} for start, size in zip(starts, sizes)]


def run_batch(run: RunFn, requests: Sequence[Mapping[str, np.ndarray]], padded: int) -> List[Dict[str, np.ndarray]]:
    """Each request's outputs of one `run` over all `requests` merged (into new aligned arrays), padded to `padded`
    rows with copies of the first row."""
    sizes = [len(next(iter(r.values()))) for r in requests]
    buffers = {name: aligned_empty((padded,) + a.shape[1:], a.dtype) for name, a in requests[0].items()}
    for request, start in zip(requests, np.cumsum([0, *sizes[:-1]])):
        copy_rows(buffers, request, start)
    return run_rows(run, pad_rows(buffers, sum(sizes), padded), sizes)


def serving_error(exc: Exception) -> ServingError:
    """`exc` as what a request of a failed batch gets: a ServingError as it is, anything else INTERNAL."""
    return exc if isinstance(exc, ServingError) else ServingError(Code.INTERNAL, f"{type(exc).__name__}: {exc}")


class BatchScheduler:
    """Queues (one per servable signature) sharing num_batch_threads batch threads. A queue lives while it holds
    batches: its run function (and so the servable behind it) is not kept once its requests are taken, and a
    version the server unloads leaves nothing here.

    `on_batch(label, rows, padded_rows)` is called for each batch run (metrics).
    """

    def __init__(self, options: BatchingOptions, on_batch: Optional[Callable[[str, int, int], None]] = None):
        self.options = options
        self._on_batch = on_batch
        self._queues: Dict[Hashable, _Queue] = {}
        self._buffers = BufferPool(options.max_batch_size, options.num_batch_threads + 2)
        self._cond = threading.Condition()
        self._stopped = False
        self._threads = [threading.Thread(target=self._work, name=f"tftrt-batch-{i}", daemon=True)
                         for i in range(options.num_batch_threads)]
        for thread in self._threads:
            thread.start()

    def submit(self, queue_id: Hashable, run: RunFn, arrays: Mapping[str, np.ndarray], label: str = "",
               loop: Optional[asyncio.AbstractEventLoop] = None) -> Union[Future, asyncio.Future]:
        """A future of `run`'s outputs for `arrays` alone, computed in a batch with other requests to `queue_id`:
        with `loop` (the caller's running loop), an asyncio future of that loop, else a concurrent one. `loop` may
        be any object with create_future() and call_soon_threadsafe(callback, *args): each batch sets its answers
        to one loop's futures by one call_soon_threadsafe(callback, [(future, answer), ...])."""
        limit = self.options.max_batch_size
        size = batch_rows(arrays, limit)
        task = _Task(size, Future() if loop is None else loop.create_future(), loop)
        key = batch_key(arrays)
        with self._cond:
            if self._stopped:
                raise ServingError(Code.UNAVAILABLE, "the server is shutting down")
            queue = self._queues.setdefault(queue_id, _Queue(run, label))
            batch = next((b for b in reversed(queue.batches) if b.key == key and not b.closed), None)
            new = batch is None or batch.size + size > limit
            if new:
                if batch is not None:
                    batch.closed = True
                if len(queue.batches) >= self.options.max_enqueued_batches:
                    self._cond.notify_all()  # the batch just closed is ready
                    raise ServingError(Code.UNAVAILABLE, "The batch scheduling queue to which this task was "
                                                         "submitted is full")
                batch = _Batch(key, time.monotonic() + self.options.batch_timeout_micros / 1e6,
                               self._buffers.take(key, arrays))
                queue.batches.append(batch)
            start = batch.size
            batch.tasks.append(task)
            batch.size += size
            batch.closed = batch.size == limit
            batch.copying += 1
            if new:  # batch threads learn of a new deadline
                self._cond.notify_all()
        try:  # outside the lock: other requests join the batch meanwhile (the arrays match its key: no error but
            # running out of memory, which leaves these rows unset in a batch whose answer nobody awaits)
            copy_rows(batch.inputs, arrays, start)
        finally:
            with self._cond:
                batch.copying -= 1
                if batch.ready(time.monotonic()):
                    self._cond.notify_all()
        return task.future

    def queue_depths(self) -> Dict[str, int]:
        """Requests waiting (not yet running), by label."""
        depths: Dict[str, int] = collections.Counter()
        with self._cond:
            for queue in self._queues.values():
                depths[queue.label] += sum(len(b.tasks) for b in queue.batches)
        return dict(depths)

    def stop(self) -> None:
        """Stop the batch threads; requests still queued fail with UNAVAILABLE."""
        with self._cond:
            self._stopped = True
            pending = [t for q in self._queues.values() for b in q.batches for t in b.tasks]
            for queue in self._queues.values():
                queue.batches.clear()
            self._cond.notify_all()
        deliver((task, ServingError(Code.UNAVAILABLE, "the server is shutting down")) for task in pending)
        for thread in self._threads:
            thread.join()

    def _next_batch(self):
        """(queue, batch) of the first batch ready to run, else (None, seconds until one may be)."""
        now, wait = time.monotonic(), None
        for queue_id, queue in self._queues.items():
            for i, batch in enumerate(queue.batches):
                if batch.ready(now):
                    del queue.batches[i]
                    if not queue.batches:
                        del self._queues[queue_id]
                    return queue, batch
                if batch.deadline > now:  # else it waits for its copies, whose end wakes the threads
                    wait = batch.deadline - now if wait is None else min(wait, batch.deadline - now)
        return None, wait

    def _work(self) -> None:
        while True:
            with self._cond:
                while True:
                    if self._stopped:
                        return
                    queue, found = self._next_batch()
                    if queue is not None:
                        break
                    self._cond.wait(found)
            self._run(queue, found)

    def _run(self, queue: _Queue, batch: _Batch) -> None:
        padded = self.options.padded_size(batch.size)
        if self._on_batch is not None:
            self._on_batch(queue.label, batch.size, padded)
        try:
            results = run_rows(queue.run, pad_rows(batch.inputs, batch.size, padded), [t.size for t in batch.tasks])
        except Exception as exc:  # every request of the batch gets the error; the thread goes on
            results = [serving_error(exc) for _ in batch.tasks]
        self._buffers.give_back(batch.key, batch.inputs)
        deliver(zip(batch.tasks, results))
