"""A gRPC call as one counted request of a Service: a ServingError aborts the call with its status code, any other
exception is logged and aborts it INTERNAL (the server goes on)."""
from __future__ import annotations

import contextlib
import logging

import grpc

from tftrt_py.serving.errors import Code, ServingError
from tftrt_py.serving.service import Service

logger = logging.getLogger(__name__)

__all__ = ["aborting"]


@contextlib.asynccontextmanager
async def aborting(context: grpc.aio.ServicerContext, service: Service, model: str, api: str):
    """Run the block as a request to `model` counted under `api`; errors abort the call."""
    try:
        with service.request(model, api):
            yield
    except ServingError as exc:
        await context.abort(exc.code.grpc_code, exc.message)
    except Exception as exc:
        logger.exception("gRPC %s failed", api)
        await context.abort(Code.INTERNAL.grpc_code, f"{type(exc).__name__}: {exc}")
