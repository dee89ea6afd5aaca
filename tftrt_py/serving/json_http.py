"""JSON over HTTP for the REST front ends (TF Serving's and the Open Inference Protocol's): request bodies parsed,
answers written, and errors answered as {"error": message} with the HTTP status of their code."""
from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import json
import logging
from typing import Any, Awaitable, Callable

import orjson
from starlette.requests import Request
from starlette.responses import Response

from tftrt_py.serving.errors import Code, ServingError

logger = logging.getLogger(__name__)

__all__ = ["MAX_BODY_BYTES", "RequestThreads", "read_body", "loads", "dumps", "json_response", "error_response",
           "answering_errors"]

#: The largest request body read, as gRPC's message limit (grpc_service.MAX_MESSAGE): a larger one is refused
#: before it is held whole.
MAX_BODY_BYTES = 2 ** 31 - 1


class RequestThreads:
    """The threads a REST app decodes request bodies and encodes answers on, off its event loop: ``await
    threads.run(fn, *args)`` runs `fn` on one of at most `count` threads (started as needed) and waits on the loop.

    A concurrent.futures pool rather than anyio's worker threads: a hop costs half the CPU (55 against 110 us on a
    2-core host with 200 other tasks alive, where anyio walks the loop's tasks to find the caller's root task on each
    call), and a request makes two."""

    def __init__(self, count: int):
        self._pool = concurrent.futures.ThreadPoolExecutor(count, thread_name_prefix="tftrt-rest")

    async def run(self, fn: Callable[..., Any], *args) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    def close(self) -> None:
        """Let the threads end once the calls they run return (calls after this are refused)."""
        self._pool.shutdown(wait=False)


async def read_body(request: Request) -> bytes:
    """The request's body, at most MAX_BODY_BYTES (RESOURCE_EXHAUSTED past it: by its Content-Length before
    reading, else once that many bytes have arrived)."""
    def too_large(size: str) -> ServingError:
        return ServingError(Code.RESOURCE_EXHAUSTED, f"the request body holds {size} bytes, more than the "
                                                     f"{MAX_BODY_BYTES} served: send less per request")

    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        raise too_large(declared)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise too_large(f"over {size}")
        chunks.append(chunk)
    return b"".join(chunks)


def loads(body: bytes):
    """The parsed JSON body: orjson (8x faster than json on a 32x32x3 image's numbers), json where orjson refuses
    (NaN and Infinity literals, integers beyond 64 bits, which TF Serving accepts); INVALID_ARGUMENT when neither
    parses it."""
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError:
        pass
    try:
        return json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ServingError(Code.INVALID_ARGUMENT, f"JSON Parse error: {exc}") from None


def dumps(body) -> bytes:
    """`body` as JSON text (json's writer: NaN and Infinity as literals, as TF Serving writes them)."""
    return json.dumps(body).encode()


def json_response(body, status: int = 200) -> Response:
    return Response(dumps(body), status_code=status, media_type="application/json")


def error_response(exc: ServingError) -> Response:
    return json_response({"error": exc.message}, exc.code.http_status)


def answering_errors(handler: Callable[[Request], Awaitable[Response]]) -> Callable[[Request], Awaitable[Response]]:
    """`handler` answering a ServingError as error_response; any other exception is logged and answers INTERNAL
    (500): the server goes on."""
    @functools.wraps(handler)
    async def answer(request: Request) -> Response:
        try:
            return await handler(request)
        except ServingError as exc:
            return error_response(exc)
        except Exception as exc:
            logger.exception("REST request %s %s failed", request.method, request.url.path)
            return error_response(ServingError(Code.INTERNAL, f"{type(exc).__name__}: {exc}"))
    return answer
