"""The REST (uvicorn over the Starlette app) and gRPC (grpc.aio) front ends over one service, started and stopped
together: in the server's process, or in each front-end worker process, where several processes listen on the
same ports (SO_REUSEPORT: the kernel spreads the connections over them)."""
from __future__ import annotations

import logging
import socket
import threading
import time
from typing import Optional

from tftrt_py.serving.service import ServiceBase

logger = logging.getLogger(__name__)

__all__ = ["FrontEnds", "listening_socket"]


def listening_socket(host: str, port: int, reuse_port: bool = False) -> socket.socket:
    """A TCP socket bound to `host:port` (0: an ephemeral port), not listening yet; with `reuse_port`, other
    sockets with SO_REUSEPORT may bind the same port."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
    except BaseException:
        sock.close()
        raise
    return sock


class FrontEnds:
    """REST on `rest_port` and gRPC on `grpc_port` (None: that API off; 0: an ephemeral port, the bound one read
    back from the attribute after start()) over `service`. Unbatched predicts run on `grpc_threads` /
    `rest_threads` threads. With `reuse_port`, the ports are shared with other processes (SO_REUSEPORT)."""

    def __init__(self, service: ServiceBase, host: str, grpc_port: Optional[int], rest_port: Optional[int],
                 grpc_threads: int = 64, rest_threads: int = 64, reuse_port: bool = False):
        self.service, self.host = service, host
        self.grpc_port, self.rest_port = grpc_port, rest_port
        self._grpc_threads, self._rest_threads, self._reuse_port = grpc_threads, rest_threads, reuse_port
        self._grpc = self._rest = self._rest_thread = None

    def start_rest(self) -> None:
        import uvicorn

        from tftrt_py.serving.rest import create_app

        if self.rest_port is None:
            return
        sock = listening_socket(self.host, self.rest_port, self._reuse_port)
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

    def start_grpc(self) -> None:
        """gRPC's server sets SO_REUSEPORT on its sockets (channel argument grpc.so_reuseport, on by default on
        Linux), so processes of one server bind one port."""
        from tftrt_py.serving.grpc_service import GrpcServer

        if self.grpc_port is None:
            return
        self._grpc = GrpcServer(self.service, self.host, self.grpc_port, self._grpc_threads)
        self.grpc_port = self._grpc.start().port

    def stop(self, grace: float = 1.0) -> None:
        """Stop listening; calls still running after `grace` seconds are cancelled."""
        if self._grpc is not None:
            self._grpc.stop(grace=grace)
            self._grpc = None
        if self._rest is not None:
            self._rest.should_exit = True
            self._rest_thread.join()
            self._rest = self._rest_thread = None
