"""TF Serving's REST API as an ASGI app (starlette): predict, model status and metadata under /v1/models, plus
/healthz (live), /readyz (models loaded) and /monitoring/prometheus/metrics; the Open Inference Protocol's under
/v2 beside it (kserve_rest). Errors answer {"error": message} with TF Serving's HTTP status for the code."""
from __future__ import annotations

import asyncio
import contextlib
import re
from typing import Optional

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from tftrt_py.serving import kserve_rest
from tftrt_py.serving.errors import Code, ServingError
from tftrt_py.serving.json_http import RequestThreads, answering_errors, json_response, loads, read_body
from tftrt_py.serving.metrics import CONTENT_TYPE
from tftrt_py.serving.service import Service
from tftrt_py.serving.tensors import rest_inputs, rest_outputs

__all__ = ["create_app", "METRICS_PATH"]

METRICS_PATH = "/monitoring/prometheus/metrics"
# TF Serving's URL grammar (http_rest_api_handler.cc)
PREDICT_URL = re.compile(r"/v1/models/([^/:]+)(?:/versions/(\d+)|/labels/([^/:]+))?:(classify|regress|predict)",
                         re.IGNORECASE)
STATUS_URL = re.compile(r"/v1/models/([^/:]+)(?:/versions/(\d+)|/labels/([^/:]+))?(/metadata)?", re.IGNORECASE)


def _version(text: Optional[str]) -> Optional[int]:
    return None if text is None else int(text)


def create_app(service: Service, threads: int = 64) -> Starlette:
    """The REST app over `service`; request bodies are decoded and predictions run on up to `threads` threads
    (batched ones wait for their batch on the event loop)."""
    pool = RequestThreads(threads)

    def submit(model: str, version: Optional[int], label: Optional[str], body: bytes):
        """(future of the outputs, row format?) of a predict body; runs on a request thread."""
        request = loads(body)
        signature_name = request.get("signature_name", "") if isinstance(request, dict) else ""
        if not isinstance(signature_name, str):
            raise ServingError(Code.INVALID_ARGUMENT, "'signature_name' must be a string")
        servable, signature = service.resolve(model, version, label, signature_name)
        arrays, row_format = rest_inputs(request, signature)
        return service.submit(servable, signature, arrays), row_format

    async def predict(model: str, version: Optional[int], label: Optional[str], body: bytes) -> Response:
        """A batched request waits for its batch on the event loop, not on a request thread (a thread per
        waiting request left dozens contending for the GIL)."""
        with service.request(model, "rest_predict"):
            future, row_format = await pool.run(submit, model, version, label, body)
            outputs = await asyncio.wrap_future(future)
            return await pool.run(lambda: json_response(rest_outputs(outputs, row_format)))

    def status(model: str, version: Optional[int], label: Optional[str], metadata: bool) -> Response:
        from google.protobuf import json_format

        def as_dict(message):
            return json_format.MessageToDict(message, preserving_proto_field_name=True,
                                             always_print_fields_with_no_presence=True)

        with service.request(model, "rest_metadata" if metadata else "rest_status"):
            if not metadata:
                return json_response(as_dict(service.status(model, version, label)))
            response, signature_defs = service.metadata(model, version, label)
            spec = as_dict(response.model_spec)
            spec["version"] = str(response.model_spec.version.value)
            return json_response({"model_spec": spec, "metadata": {"signature_def": as_dict(signature_defs)}})

    @answering_errors
    async def models(request: Request) -> Response:
        path = "/v1/models/" + request.path_params["rest"]  # without the prefix of an app mounted under one
        if request.method == "POST":
            match = PREDICT_URL.fullmatch(path)
            if match is None:
                raise ServingError(Code.NOT_FOUND, f"Malformed request: POST {path}")
            model, version, label, verb = match.groups()
            if verb.lower() != "predict":
                raise ServingError(Code.UNIMPLEMENTED, f"{verb} is not served: only predict")
            return await predict(model, _version(version), label, await read_body(request))
        match = STATUS_URL.fullmatch(path)
        if match is None:
            raise ServingError(Code.NOT_FOUND, f"Malformed request: GET {path}")
        model, version, label, metadata = match.groups()
        return await pool.run(status, model, _version(version), label, bool(metadata))

    async def healthz(request: Request) -> Response:
        return PlainTextResponse("ok")

    async def readyz(request: Request) -> Response:
        ready = service.manager.ready
        return PlainTextResponse("ready" if ready else "loading", status_code=200 if ready else 503)

    async def metrics(request: Request) -> Response:
        return Response(service.metrics.exposition(), media_type=CONTENT_TYPE)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette):
        try:
            yield
        finally:
            pool.close()

    return Starlette(routes=[
        Route("/healthz", healthz), Route("/readyz", readyz), Route(METRICS_PATH, metrics),
        Route("/v1/models/{rest:path}", models, methods=["GET", "POST"]),
        *kserve_rest.routes(service, pool),
    ], lifespan=lifespan)
