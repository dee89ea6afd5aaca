"""Front-end worker processes feeding this process, the model process: N spawned processes each serve the REST
and gRPC front ends on the same ports (SO_REUSEPORT: the kernel spreads connections over them), parse requests
into arrays and send them here, where the one Service (ModelManager, BatchScheduler, engines) runs them. Request
parsing and answer encoding, most of a request's CPU, so scale with cores while the engines and batches stay in
one process.

Per worker: a control link (worker_link) and two shared-memory arenas (shared_tensors): requests (the worker
writes, this process reads the inputs in place) and responses (this process writes, the worker copies out and
says the block is free). A watcher thread pushes the version table to the workers whenever a version loads or
unloads, and starts a new worker in place of one that died. Workers are spawned, never forked: this process has
TensorFlow's and gRPC's threads, which a fork would copy in a broken state."""
from __future__ import annotations

import itertools
import logging
import pickle
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from multiprocessing.connection import Connection
from typing import List, Optional

from tftrt_py.serving.batching import serving_error
from tftrt_py.serving.errors import ServingError
from tftrt_py.serving.frontend_worker import WorkerConfig
from tftrt_py.serving.frontends import listening_socket
from tftrt_py.serving.service import Service
from tftrt_py.serving.shared_tensors import Arena
from tftrt_py.serving.worker_link import Link

logger = logging.getLogger(__name__)

__all__ = ["WorkerPool", "ARENA_BYTES"]

#: bytes of each arena (two per worker): memory is taken only as tensors in flight touch it; a request whose
#: tensors find no room travels in its control message instead
ARENA_BYTES = 256 << 20
START_TIMEOUT = 300.0  # seconds a worker may take to import its front ends and listen
WATCH_SECONDS = 0.1  # how often the watcher looks for version changes and dead workers
FLUSH_SECONDS = 1.0  # how long a metrics scrape waits for the workers' request counts
STOP_SECONDS = 10.0  # how long a stopping worker may take before it is killed
QUICK_DEATH_SECONDS = 10.0  # a worker that dies sooner after its start is replaced only after RESTART_DELAY
RESTART_DELAY = 1.0
WORKER_COMMAND = "from tftrt_py.serving.frontend_worker import run; run()"


class _Worker:
    """One worker process and this process's side of its link and arenas."""

    def __init__(self, index: int, process, link: Link, requests: Arena, responses: Arena, generation: int):
        self.index, self.process, self.link = index, process, link
        self.requests, self.responses = requests, responses
        self.generation = generation  # the newest version table it holds
        self.flushed = -1  # the newest flush it answered
        self.started = threading.Event()
        self.failure: Optional[str] = None
        self.started_at = time.monotonic()
        self.reader: Optional[threading.Thread] = None
        self.batches = _Batches(link, responses)

    @property
    def alive(self) -> bool:
        return self.process.poll() is None


class WorkerPool:
    """`count` front-end worker processes serving `service`'s models on `host`'s `grpc_port` and `rest_port`
    (None: that API off; 0: an ephemeral port, read back after start()); each worker's front ends have
    `grpc_threads` and `rest_threads` threads. Unbatched predicts run here on max(grpc_threads, rest_threads)
    threads."""

    def __init__(self, service: Service, count: int, host: str, grpc_port: Optional[int], rest_port: Optional[int],
                 grpc_threads: int = 64, rest_threads: int = 64, arena_bytes: int = ARENA_BYTES):
        if count < 1:
            raise ValueError(f"a worker pool needs at least one worker, got {count}")
        self.service, self.count, self.host = service, count, host
        self.grpc_port, self.rest_port = grpc_port, rest_port
        self._grpc_threads, self._rest_threads, self._arena_bytes = grpc_threads, rest_threads, arena_bytes
        self._workers: List[Optional[_Worker]] = [None] * count
        self._reserved = []  # bound (not listening) SO_REUSEPORT sockets holding the ports while workers come and go
        self._run = ThreadPoolExecutor(max(grpc_threads, rest_threads), thread_name_prefix="tftrt-serve-run")
        self._calls = ThreadPoolExecutor(2, thread_name_prefix="tftrt-serve-calls")
        self._changed = threading.Condition()  # a worker acknowledged a version table or a flush
        self._views = threading.Lock()  # one version table push at a time, in generation order
        self._generation, self._state = 0, None
        self._flushes = itertools.count()
        self._stopping = threading.Event()
        self._watcher: Optional[threading.Thread] = None
        self.restarts = 0

    def start(self) -> "WorkerPool":
        """Reserve the ports and spawn the workers (without waiting for them: see wait_started)."""
        for attr in ("grpc_port", "rest_port"):
            if getattr(self, attr) is not None:
                setattr(self, attr, self._reserve(getattr(self, attr)))
        self._state = self.service.manager.state()
        for index in range(self.count):
            self._workers[index] = self._spawn(index)
        self._watcher = threading.Thread(target=self._watch, name="tftrt-serve-workers", daemon=True)
        self._watcher.start()
        return self

    def _reserve(self, port: int) -> int:
        """Hold `port` (0: a free one) for the workers; OSError when another socket has it. A first bind without
        SO_REUSEPORT fails on any socket bound there (another server's workers too, which a SO_REUSEPORT bind
        would join); then a bound, non-listening SO_REUSEPORT socket keeps the port while the workers listen."""
        with listening_socket(self.host, port) as probe:
            port = probe.getsockname()[1]
        sock = listening_socket(self.host, port, reuse_port=True)
        self._reserved.append(sock)
        return port

    def wait_started(self, timeout: float = START_TIMEOUT) -> None:
        """Wait until every worker listens; RuntimeError when one cannot start."""
        deadline = time.monotonic() + timeout
        for worker in list(self._workers):
            while not worker.started.wait(0.05):
                if not worker.alive or time.monotonic() > deadline:
                    why = worker.failure or (f"exit code {worker.process.returncode}" if not worker.alive
                                             else f"not listening after {timeout:.0f} s")
                    raise RuntimeError(f"front-end worker {worker.index} could not start: {why}")

    def sync(self, timeout: float = 30.0) -> None:
        """Push the version table now and wait until every live worker holds it."""
        generation = self._push(force=True)
        deadline = time.monotonic() + timeout
        with self._changed:
            self._changed.wait_for(lambda: all(w.generation >= generation or not w.alive
                                               for w in self._live()), max(0.0, deadline - time.monotonic()))

    def pids(self) -> List[int]:
        """The process ids of the workers running now."""
        return [w.process.pid for w in self._live()]

    def listening(self) -> bool:
        """Whether all `count` workers run and listen."""
        live = self._live()
        return len(live) == self.count and all(w.alive and w.started.is_set() for w in live)

    def stop(self) -> None:
        """Stop the workers (each stops listening; calls in flight get its grace to finish), then this side."""
        self._stopping.set()
        if self._watcher is not None:
            self._watcher.join()
        workers = self._live()
        for worker in workers:
            worker.link.send(("stop",))
        for worker in workers:
            try:
                worker.process.wait(STOP_SECONDS)
            except subprocess.TimeoutExpired:
                logger.warning("front-end worker %d (pid %d) did not stop: killing it", worker.index,
                               worker.process.pid)
                worker.process.kill()
                worker.process.wait()
            self._release(worker)
        self._workers = [None] * self.count
        self._run.shutdown(wait=True)
        self._calls.shutdown(wait=True)
        for sock in self._reserved:
            sock.close()
        self._reserved = []

    def _live(self) -> List[_Worker]:
        return [w for w in self._workers if w is not None]

    def _spawn(self, index: int) -> _Worker:
        """A new worker process (a fresh interpreter: `python -c ...run()`), given its end of the link and the
        arenas' memory files as inherited descriptors, and its configuration as the link's first message."""
        requests, responses = Arena(self._arena_bytes), Arena(self._arena_bytes)
        ours, theirs = socket.socketpair()
        try:
            config = WorkerConfig(index, tuple(self.service.manager.specs.values()), self.host, self.grpc_port,
                                  self.rest_port, self._grpc_threads, self._rest_threads,
                                  logging.getLogger().getEffectiveLevel(), requests.fd, responses.fd)
            process = subprocess.Popen([sys.executable, "-c", WORKER_COMMAND, str(theirs.fileno())],
                                       pass_fds=(theirs.fileno(), requests.fd, responses.fd))
        finally:
            theirs.close()
            requests.close_fd()
            responses.close_fd()
        link = Link(Connection(ours.detach()), f"tftrt-serve-worker-{index}")
        with self._views:
            generation = self._generation
            link.send((config, self._arena_bytes, self.service.manager.snapshot()))
        worker = _Worker(index, process, link, requests, responses, generation)
        worker.reader = threading.Thread(target=self._read, args=(worker,), name=f"tftrt-serve-worker-{index}-read",
                                         daemon=True)
        worker.reader.start()
        logger.info("front-end worker %d started (pid %d)", index, process.pid)
        return worker

    def _release(self, worker: _Worker) -> None:
        """Close this side of a worker that ended: its link; its arenas go with the last view of their tensors."""
        worker.link.close()
        worker.reader.join()

    def _watch(self) -> None:
        """Push version changes; replace dead workers."""
        while not self._stopping.wait(WATCH_SECONDS):
            try:
                self._push()
                for index, worker in enumerate(self._workers):
                    if worker is not None and not worker.alive and not self._stopping.is_set():
                        self._replace(index, worker)
            except Exception:  # the watcher must go on: the next round tries again
                logger.exception("watching the front-end workers failed")

    def _replace(self, index: int, worker: _Worker) -> None:
        lived = time.monotonic() - worker.started_at
        logger.warning("front-end worker %d (pid %d) exited with code %s after %.1f s: starting another", index,
                       worker.process.pid, worker.process.returncode, lived)
        self._release(worker)
        if lived < QUICK_DEATH_SECONDS and self._stopping.wait(RESTART_DELAY):
            self._workers[index] = None
            return
        self._workers[index] = self._spawn(index)
        self.restarts += 1

    def _push(self, force: bool = False) -> int:
        """Send the version table to every worker when it changed (or `force`); the generation sent."""
        with self._views:
            state = self.service.manager.state()
            if force or state != self._state:
                self._generation += 1
                snapshot = self.service.manager.snapshot()
                for worker in self._live():
                    worker.link.send(("view", self._generation, snapshot))
                self._state = state
            return self._generation

    def _read(self, worker: _Worker) -> None:
        while True:
            try:
                items = worker.link.receive()
            except (EOFError, OSError):
                return
            except pickle.UnpicklingError as exc:  # not what a worker sends: it is ended, and the watcher replaces it
                logger.error("front-end worker %d (pid %d) sent a message it may not: %s; ending it", worker.index,
                             worker.process.pid, exc)
                worker.process.kill()
                return
            for item in items:
                try:
                    self._handle(worker, item)
                except Exception:
                    logger.exception("front-end worker %d: item %r failed", worker.index, item[0])

    def _handle(self, worker: _Worker, item: tuple) -> None:
        kind = item[0]
        if kind == "predict":
            self._predict(worker, *item[1:])
        elif kind == "observe":
            self.service.metrics.observe_request(*item[1:])
        elif kind == "freed":
            for block in item[1]:
                worker.responses.free(block)
        elif kind == "call":
            self._calls.submit(self._call, worker, item[1], item[2])
        elif kind in ("view_ack", "flushed"):
            with self._changed:
                setattr(worker, "generation" if kind == "view_ack" else "flushed", item[1])
                self._changed.notify_all()
        elif kind == "started":
            worker.started.set()
            logger.info("front-end worker %d (pid %d) listening %.1f s after its start", worker.index,
                        worker.process.pid, time.monotonic() - worker.started_at)
        elif kind == "failed":
            worker.failure = item[1]
        else:
            logger.error("front-end worker %d sent an item of unknown kind %r", worker.index, kind)

    def _predict(self, worker: _Worker, request_id: int, model: str, version: int, signature_name: str,
                 names, descriptors) -> None:
        """Run a worker's predict; its inputs are read in place from the worker's request arena (the worker frees
        them once answered)."""
        try:
            servable = self.service.manager.servable(model, version)
            signature = servable.signature(signature_name)
            arrays = worker.requests.read(descriptors)
            if self.service.scheduler is not None:
                worker.batches.next = (request_id, names)
                self.service.enqueue(servable, signature, signature.check(arrays), worker.batches)
                return
            future = self.service.submit(servable, signature, arrays, names, self._run)
        except Exception as exc:
            worker.link.send(_error(request_id, exc))
            return
        future.add_done_callback(lambda done: worker.link.send(lambda: _answer(worker, request_id, done)))

    def _call(self, worker: _Worker, request_id: int, what: str) -> None:
        try:
            if what != "metrics":
                raise ValueError(f"unknown call {what!r}")
            self._flush()
            worker.link.send(("reply", request_id, self.service.metrics.exposition()))
        except Exception as exc:
            worker.link.send(_error(request_id, exc))

    def _flush(self) -> None:
        """Wait (FLUSH_SECONDS at most) until every worker sent the request counts it holds."""
        token = next(self._flushes)
        workers = [w for w in self._live() if w.started.is_set()]
        for worker in workers:
            worker.link.send(("flush", token))
        with self._changed:
            self._changed.wait_for(lambda: all(w.flushed >= token or not w.alive for w in workers),
                                   FLUSH_SECONDS)


class _Slot:
    """A batched request's answer: the batch sets it (BatchScheduler's futures need only set_result and
    set_exception)."""

    __slots__ = ("request_id", "names", "answer")

    def __init__(self, request_id: int, names):
        self.request_id, self.names, self.answer = request_id, names, None

    def set_result(self, outputs) -> None:
        self.answer = {k: outputs[k] for k in self.names}

    def set_exception(self, exc: BaseException) -> None:
        self.answer = exc


class _Batches:
    """A worker's batched requests, as BatchScheduler.submit takes an event loop: the answers of one batch to
    them are set by one call (on the batch thread), then go to the worker in one message, their outputs written
    by the link's sender thread. `next` is the (request id, output names) of the request being queued (one
    thread, the worker's reader, queues them)."""

    def __init__(self, link: Link, responses: Arena):
        self.link, self.responses = link, responses  # not the worker: no reference cycle keeps its arenas
        self.next = None

    def create_future(self) -> _Slot:
        return _Slot(*self.next)

    def call_soon_threadsafe(self, settle_all, pairs) -> None:
        settle_all(pairs)
        responses, slots = self.responses, [slot for slot, _ in pairs]
        self.link.send(lambda: [_item(responses, s.request_id, s.answer) for s in slots])


def _error(request_id: int, exc: BaseException) -> tuple:
    if not isinstance(exc, ServingError):
        logger.error("a front-end worker's request failed", exc_info=exc)
    error = serving_error(exc)
    return "error", request_id, error.code.name, error.message


def _item(responses: Arena, request_id: int, answer) -> tuple:
    """The answer item of a finished predict (outputs, or the exception), its outputs written into the worker's
    response arena (on the link's sender thread)."""
    if isinstance(answer, BaseException):
        return _error(request_id, answer)
    block, descriptors = responses.write(answer)
    return "answer", request_id, block, descriptors


def _answer(worker: _Worker, request_id: int, done: Future) -> tuple:
    """The answer item of an unbatched predict's future."""
    exc = done.exception()
    return _item(worker.responses, request_id, exc if exc is not None else done.result())
