"""A tftrt-serve server in-process: `Server(models, ...).start()` serves REST and gRPC (port 0: an ephemeral
port, read back from `rest_port` / `grpc_port`; None: that API off) until `stop()`; also a context manager.
While it runs it polls each model's base path for versions to load and unload."""
from __future__ import annotations

import logging
import socket
import threading
import time
from typing import Optional, Sequence

from tftrt_py.serving.config import BatchingOptions, ModelSpec

logger = logging.getLogger(__name__)

__all__ = ["Server"]


class Server:
    """Serves `models` over REST and gRPC; `batching` (None: off) batches predict calls. Unbatched predicts run
    on `grpc_threads` / `rest_threads` threads (batched ones wait for their batch on an event loop). Every
    `file_system_poll_wait_seconds` (TF Serving's flag and default; 0: only at start) a background thread loads
    the versions the policies newly select and unloads those no longer selected (ModelManager.refresh)."""

    def __init__(self, models: Sequence[ModelSpec], *, grpc_port: Optional[int] = 0, rest_port: Optional[int] = 0,
                 host: str = "127.0.0.1", batching: Optional[BatchingOptions] = None, grpc_threads: int = 64,
                 rest_threads: int = 64, file_system_poll_wait_seconds: float = 1):
        if grpc_port is None and rest_port is None:
            raise ValueError("serve at least one API: give a gRPC or a REST port")
        if file_system_poll_wait_seconds < 0:
            raise ValueError(f"file_system_poll_wait_seconds must be >= 0 (0: look for versions only at start), "
                             f"got {file_system_poll_wait_seconds}")
        self.file_system_poll_wait_seconds = file_system_poll_wait_seconds
        self.models, self.host, self.batching = list(models), host, batching
        self.grpc_port, self.rest_port = grpc_port, rest_port
        self._grpc_threads, self._rest_threads = grpc_threads, rest_threads
        self.service = None
        self._grpc = self._rest = self._rest_thread = None

    def start(self) -> "Server":
        """REST first (/healthz answers, /readyz says loading), then load the models, then gRPC, then poll."""
        from tftrt_py.serving.models import ModelManager
        from tftrt_py.serving.service import Service

        self.service = Service(ModelManager(self.models), self.batching)
        try:
            if self.rest_port is not None:
                self._start_rest()
            self.service.manager.load()
            if self.grpc_port is not None:
                self._start_grpc()
            if self.file_system_poll_wait_seconds > 0:
                self.service.manager.start_polling(self.file_system_poll_wait_seconds)
        except BaseException:
            self.stop()
            raise
        logger.info("serving %s (gRPC port %s, REST port %s, batching %s)",
                       ", ".join(m.name for m in self.models), self.grpc_port, self.rest_port,
                       "on" if self.batching else "off")
        return self

    def _start_rest(self) -> None:
        import uvicorn

        from tftrt_py.serving.rest import create_app

        sock = socket.socket(socket.AF_INET6 if ":" in self.host else socket.AF_INET)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, self.rest_port))
        self.rest_port = sock.getsockname()[1]
        config = uvicorn.Config(create_app(self.service, self._rest_threads), log_level="warning",
                                access_log=False, lifespan="off", timeout_graceful_shutdown=5)
        self._rest = uvicorn.Server(config)
        self._rest_thread = threading.Thread(target=self._rest.run, kwargs={"sockets": [sock]},
                                             name="tftrt-serve-rest", daemon=True)
        self._rest_thread.start()
        while not self._rest.started:
            if not self._rest_thread.is_alive():
                raise RuntimeError(f"the REST server on {self.host}:{self.rest_port} did not start")
            time.sleep(0.01)

    def _start_grpc(self) -> None:
        from tftrt_py.serving.grpc_service import GrpcServer

        self._grpc = GrpcServer(self.service, self.host, self.grpc_port, self._grpc_threads)
        self.grpc_port = self._grpc.start().port

    def stop(self) -> None:
        """Stop polling, stop listening, fail queued requests (UNAVAILABLE), end the batch threads."""
        if self.service is not None:
            self.service.manager.stop_polling()
        if self._grpc is not None:
            self._grpc.stop(grace=1)
            self._grpc = None
        if self._rest is not None:
            self._rest.should_exit = True
            self._rest_thread.join()
            self._rest = self._rest_thread = None
        if self.service is not None:
            self.service.close()

    def __enter__(self) -> "Server":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
