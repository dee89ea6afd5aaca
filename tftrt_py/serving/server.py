"""A tftrt-serve server in-process: `Server(models, ...).start()` serves REST and gRPC (port 0: an ephemeral
port, read back from `rest_port` / `grpc_port`; None: that API off) until `stop()`; also a context manager.
While it runs it polls each model's base path for versions to load and unload. With `frontend_workers` N >= 1,
N spawned processes serve the front ends on those ports and this process runs the models (worker_pool)."""
from __future__ import annotations

import logging
from typing import Optional, Sequence

from tftrt_py.serving.config import BatchingOptions, ModelSpec

logger = logging.getLogger(__name__)

__all__ = ["Server"]


class Server:
    """Serves `models` over REST and gRPC; `batching` (None: off) batches predict calls. Unbatched predicts run
    on `grpc_threads` / `rest_threads` threads (batched ones wait for their batch on an event loop). Every
    `file_system_poll_wait_seconds` (TF Serving's flag and default; 0: only at start) a background thread loads
    the versions the policies newly select and unloads those no longer selected (ModelManager.refresh).

    `frontend_workers` (0: none) front-end worker processes parse and answer the requests on the same ports and
    send the tensors here through shared memory; this process then only runs models, batches and metrics."""

    def __init__(self, models: Sequence[ModelSpec], *, grpc_port: Optional[int] = 0, rest_port: Optional[int] = 0,
                 host: str = "127.0.0.1", batching: Optional[BatchingOptions] = None, grpc_threads: int = 64,
                 rest_threads: int = 64, file_system_poll_wait_seconds: float = 1, frontend_workers: int = 0,
                 warmup_iterations: int = 1):
        if grpc_port is None and rest_port is None:
            raise ValueError("serve at least one API: give a gRPC or a REST port")
        if file_system_poll_wait_seconds < 0:
            raise ValueError(f"file_system_poll_wait_seconds must be >= 0 (0: look for versions only at start), "
                             f"got {file_system_poll_wait_seconds}")
        if frontend_workers < 0:
            raise ValueError(f"frontend_workers must be >= 0 (0: the front ends run in this process), got "
                             f"{frontend_workers}")
        if warmup_iterations < 0:
            raise ValueError(f"warmup_iterations must be >= 0 (0: no warm-up), got {warmup_iterations}")
        self.warmup_iterations = warmup_iterations
        self.file_system_poll_wait_seconds = file_system_poll_wait_seconds
        self.models, self.host, self.batching = list(models), host, batching
        self.grpc_port, self.rest_port = grpc_port, rest_port
        self._grpc_threads, self._rest_threads = grpc_threads, rest_threads
        self.frontend_workers = frontend_workers
        self.service = None
        self.workers = self._fronts = None

    def start(self) -> "Server":
        """REST first (/healthz answers, /readyz says loading), then load the models, then gRPC, then poll. With
        front-end workers: spawn them, load the models meanwhile, wait until they listen and hold the loaded
        versions."""
        from tftrt_py.serving.frontends import FrontEnds
        from tftrt_py.serving.models import ModelManager
        from tftrt_py.serving.service import Service
        from tftrt_py.serving.warmup import warmer
        from tftrt_py.serving.worker_pool import WorkerPool

        self.service = Service(ModelManager(self.models, warmer(self.warmup_iterations)), self.batching)
        try:
            if self.frontend_workers:
                self.workers = WorkerPool(self.service, self.frontend_workers, self.host, self.grpc_port,
                                          self.rest_port, self._grpc_threads, self._rest_threads)
                self.workers.start()
                self.grpc_port, self.rest_port = self.workers.grpc_port, self.workers.rest_port
                self.service.manager.load()
                self.workers.wait_started()
                self.workers.sync()
            else:
                self._fronts = FrontEnds(self.service, self.host, self.grpc_port, self.rest_port, self._grpc_threads,
                                         self._rest_threads)
                self._fronts.start_rest()
                self.rest_port = self._fronts.rest_port
                self.service.manager.load()
                self._fronts.start_grpc()
                self.grpc_port = self._fronts.grpc_port
            if self.file_system_poll_wait_seconds > 0:
                self.service.manager.start_polling(self.file_system_poll_wait_seconds)
        except BaseException:
            self.stop()
            raise
        logger.info("serving %s (gRPC port %s, REST port %s, batching %s, front-end workers %d)",
                    ", ".join(m.name for m in self.models), self.grpc_port, self.rest_port,
                    "on" if self.batching else "off", self.frontend_workers)
        return self

    def stop(self) -> None:
        """Stop polling, stop listening, fail queued requests (UNAVAILABLE), end the batch threads."""
        if self.service is not None:
            self.service.manager.stop_polling()
        if self._fronts is not None:
            self._fronts.stop(grace=1)
            self._fronts = None
        if self.workers is not None:
            self.workers.stop()
            self.workers = None
        if self.service is not None:
            self.service.close()

    def __enter__(self) -> "Server":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
