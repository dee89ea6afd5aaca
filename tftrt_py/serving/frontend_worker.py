"""A front-end worker process: tftrt-serve's REST and gRPC front ends (TF Serving's API and KServe v2), unchanged,
over a WorkerService, which answers what it can from its copy of the model process's version table (resolution,
status, metadata, readiness) and sends predicts to the model process: input tensors through a shared-memory arena
this process writes, answers through one the model process writes (shared_tensors), small items over the
control link (worker_link). Requests are counted here and the counts sent to the model process, which keeps the
one set of metrics. The process ends when the model process says stop or goes away."""
from __future__ import annotations

import asyncio
import dataclasses
import gc
import itertools
import logging
import os
import pickle
import signal
import sys
import threading
from concurrent.futures import Executor, Future
from multiprocessing.connection import Connection
from typing import Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

from tftrt_py.serving.batching import deliver
from tftrt_py.serving.config import ModelSpec
from tftrt_py.serving.errors import Code, ServingError
from tftrt_py.serving.frontends import FrontEnds
from tftrt_py.serving.models import ServableSpec, SignatureSpec, VersionTable
from tftrt_py.serving.service import ServiceBase
from tftrt_py.serving.shared_tensors import Arena
from tftrt_py.serving.worker_link import Link

logger = logging.getLogger(__name__)

__all__ = ["WorkerConfig", "WorkerService", "run", "start"]

CALL_TIMEOUT = 30.0  # seconds a call to the model process (a metrics scrape) may take
STOP_GRACE = 1.0  # seconds calls in flight get to finish when the worker stops


@dataclasses.dataclass(frozen=True)
class WorkerConfig:
    """What a worker serves and where: ports (None: that API off) shared with the other workers."""

    index: int
    specs: Tuple[ModelSpec, ...]
    host: str
    grpc_port: Optional[int]
    rest_port: Optional[int]
    grpc_threads: int
    rest_threads: int
    log_level: int
    request_fd: int  # the worker's descriptors of the two arenas' memory files
    response_fd: int


class RemoteMetrics:
    """The worker's side of the model process's metrics: requests observed here are sent there (lazily, with
    the next message); a scrape asks the model process, which first collects every worker's counts."""

    def __init__(self, service: "WorkerService"):
        self._service = service

    def observe_request(self, model: str, api: str, status: str, seconds: float) -> None:
        self._service.link.send_lazily(("observe", model, api, status, seconds))

    def exposition(self) -> bytes:
        return self._service.call("metrics")


@dataclasses.dataclass
class _Pending:
    future: Union[Future, asyncio.Future]
    loop: Optional[asyncio.AbstractEventLoop]  # an asyncio future's loop; None: a concurrent future
    block: int  # the inputs' block of the request arena (-1: none)


class WorkerService(ServiceBase):
    """A Service whose predicts run in the model process (over `link`, tensors in `requests` and `responses`);
    `manager` is the latest copy of the model process's version table."""

    def __init__(self, specs: Sequence[ModelSpec], snapshot, link: Link, requests: Arena, responses: Arena):
        super().__init__(VersionTable.copy(specs, snapshot), None)
        self.metrics = RemoteMetrics(self)
        self.link, self._requests, self._responses = link, requests, responses
        self._specs = tuple(specs)
        self._ids = itertools.count()
        self._pending: Dict[int, _Pending] = {}
        self._lock = threading.Lock()

    def _send(self, servable: ServableSpec, signature: SignatureSpec, arrays: Mapping[str, np.ndarray],
              output_filter: Sequence[str], loop: Optional[asyncio.AbstractEventLoop]):
        arrays = signature.check(arrays)
        names = signature.output_names(output_filter)
        future = Future() if loop is None else loop.create_future()
        block, descriptors = self._requests.write(arrays)
        with self._lock:
            request_id = next(self._ids)
            self._pending[request_id] = _Pending(future, loop, block)
        self.link.send(("predict", request_id, servable.name, servable.version, signature.name, names, descriptors))
        return future

    async def predict(self, servable: ServableSpec, signature: SignatureSpec, arrays: Mapping[str, np.ndarray],
                      output_filter: Sequence[str] = (), executor: Optional[Executor] = None) -> Dict[str, np.ndarray]:
        """The model process's outputs, awaited on the running loop (answers to one loop that come in one
        message are set in one wake-up of the loop)."""
        return await self._send(servable, signature, arrays, output_filter, asyncio.get_running_loop())

    def submit(self, servable: ServableSpec, signature: SignatureSpec, arrays: Mapping[str, np.ndarray],
               output_filter: Sequence[str] = (), executor: Optional[Executor] = None) -> Future:
        """A future of the model process's outputs; cancelling it drops the answer, not the run."""
        return self._send(servable, signature, arrays, output_filter, None)

    def call(self, what: str):
        """What the model process answers to `what` (waits up to CALL_TIMEOUT seconds)."""
        future: Future = Future()
        with self._lock:
            request_id = next(self._ids)
            self._pending[request_id] = _Pending(future, None, -1)
        self.link.send(("call", request_id, what))
        return future.result(CALL_TIMEOUT)

    def serve(self, stop: threading.Event) -> None:
        """Handle the model process's messages; set `stop` when it says stop (answers still come in while the
        front ends stop) or goes away (requests still waiting fail UNAVAILABLE)."""
        while True:
            try:
                items = self.link.receive()
            except (EOFError, OSError, pickle.UnpicklingError):  # gone, or not the model process talking
                break
            if not self._handle(items):
                stop.set()
        if not stop.is_set():
            logger.warning("front-end worker %d: the model process went away", os.getpid())
        with self._lock:
            pending, self._pending = list(self._pending.values()), {}
        deliver([(p, ServingError(Code.UNAVAILABLE, "the server is shutting down")) for p in pending])
        stop.set()

    def _handle(self, items: List[tuple]) -> bool:
        """Act on one message's items; False when it says stop."""
        answers: List[Tuple[_Pending, object]] = []
        freed: List[int] = []
        for item in items:
            kind = item[0]
            if kind in ("answer", "error", "reply"):
                with self._lock:
                    pending = self._pending.pop(item[1], None)
                if pending is None:
                    continue
                if pending.block >= 0:
                    self._requests.free(pending.block)
                if kind == "answer":
                    _, _, block, descriptors = item
                    answers.append((pending, self._responses.read(descriptors, copy=True)))
                    if block >= 0:
                        freed.append(block)
                elif kind == "error":
                    answers.append((pending, ServingError(Code[item[2]], item[3])))
                else:
                    answers.append((pending, item[2]))
            elif kind == "view":
                _, generation, snapshot = item
                self.manager = VersionTable.copy(self._specs, snapshot)
                self.link.send(("view_ack", generation))
            elif kind == "flush":
                self.link.send(("flushed", item[1]))  # after the lazy items: the counts go first
        if freed:
            self.link.send_lazily(("freed", freed))
        deliver(answers)
        return not any(item[0] == "stop" for item in items)


def run() -> None:
    """The worker process's entry (`python -c "from tftrt_py.serving.frontend_worker import run; run()" FD`): FD
    is its end of the control link, whose first item is `start()`'s arguments (the model process's link may send
    the items queued after it, a version change say, in the same message: `start()` acts on them first)."""
    fd = int(sys.argv[1])
    link = Link(Connection(fd), f"tftrt-serve-worker-{os.getpid()}", direct=True)
    (config, arena_bytes, snapshot), *early = link.receive()
    start(config, link, arena_bytes, snapshot, early)


def start(config: WorkerConfig, link: Link, arena_bytes: int, snapshot, early: Sequence[tuple] = ()) -> None:
    """Map the arenas (memory files the model process passed as `config.request_fd` and `config.response_fd`),
    start the front ends on the shared ports, say so, act on the `early` items (those that came with the start's
    arguments), serve until told to stop."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the model process stops the workers (a terminal's ^C hits all)
    logging.basicConfig(level=config.log_level, format="%(levelname)s %(name)s: %(message)s")
    fronts = None
    try:
        requests = Arena(arena_bytes, config.request_fd)
        responses = Arena(arena_bytes, config.response_fd)
        service = WorkerService(config.specs, snapshot, link, requests, responses)
        fronts = FrontEnds(service, config.host, config.grpc_port, config.rest_port, config.grpc_threads,
                           config.rest_threads, reuse_port=True)
        fronts.start_rest()
        fronts.start_grpc()
    except Exception as exc:
        logger.exception("front-end worker %d could not start", config.index)
        link.send(("failed", f"{type(exc).__name__}: {exc}"))
        link.close()
        if fronts is not None:
            fronts.stop(grace=0)
        raise SystemExit(1)
    gc.collect()
    gc.freeze()  # TensorFlow's and the front ends' objects: the cyclic collector skips them (see models.py)
    link.send(("started", os.getpid()))
    stop = threading.Event()
    if early and not service._handle(list(early)):  # pylint: disable=protected-access
        stop.set()
    threading.Thread(target=service.serve, args=(stop,), name="tftrt-serve-worker-receive", daemon=True).start()
    stop.wait()
    fronts.stop(grace=STOP_GRACE)
    link.close()
