"""The Open Inference Protocol's REST API (KServe v2) beside TF Serving's: health, server and model metadata, model
readiness and inference under /v2, with the binary tensor data extension that tritonclient speaks: a body is its
JSON header (Inference-Header-Content-Length bytes, the whole body without that header) followed by the raw bytes
of each tensor whose parameters give a binary_data_size, in the order of the tensors. Errors answer
{"error": message} with the HTTP status of their code."""
from __future__ import annotations

import asyncio
import dataclasses
import zlib
from typing import Any, Dict, List, Mapping, Optional, Tuple

import numpy as np
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from tftrt_py.serving.errors import invalid
from tftrt_py.serving.json_http import RequestThreads, answering_errors, dumps, json_response, loads, read_body
from tftrt_py.serving.kserve import (SIGNATURE_PARAMETER, check_output_parameters, model_metadata, model_ready,
                                     model_version, server_metadata)
from tftrt_py.serving.kserve_tensors import datatype, from_json, from_raw, to_json, to_raw
from tftrt_py.serving.models import Servable
from tftrt_py.serving.service import Service

__all__ = ["routes", "InferRequest", "parse_infer", "HEADER_LENGTH"]

HEADER_LENGTH = "Inference-Header-Content-Length"
#: request body encodings accepted (Content-Encoding), as tritonclient's request_compression_algorithm sends them:
#: zlib's window bits for each (gzip's header and trailer; deflate as zlib.compress writes it)
ENCODINGS = {"gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}
#: A compressed body that decompresses to more than this is refused (a few KB of zeros can expand to gigabytes).
MAX_DECODED_BYTES = 1 << 30
KINDS = {str: "a string", int: "a whole number", bool: "true or false", list: "a list"}  # JSON value kinds



def _object(value: Any, where: str) -> Dict[str, Any]:
    if not isinstance(value, dict):
        raise invalid(f"{where} must be a JSON object")
    return value


def _typed(value: Any, kind: type, where: str):
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise invalid(f"{where} must be {KINDS[kind]}, got {value!r}")
    return value


def _parameters(owner: Dict[str, Any], where: str) -> Dict[str, Any]:
    return _object(owner.get("parameters", {}), f"{where}'s parameters")


@dataclasses.dataclass(frozen=True)
class InferRequest:
    """An inference request, its body parsed and its input tensors decoded."""

    id: Optional[str]
    signature_name: str
    inputs: Dict[str, np.ndarray]
    outputs: List[str]  # the outputs asked for (empty: all)
    binary: Mapping[str, bool]  # outputs asked for with parameters binary_data
    binary_default: bool  # parameters binary_data_output: outputs as raw bytes unless they say otherwise

    def binary_output(self, name: str) -> bool:
        return self.binary.get(name, self.binary_default)


def _decoded(body: bytes, encoding: Optional[str]) -> bytes:
    """`body` decompressed as its Content-Encoding says, to at most MAX_DECODED_BYTES."""
    if encoding is None:
        return body
    wbits = ENCODINGS.get(encoding.strip().lower())
    if wbits is None:
        raise invalid(f"Content-Encoding {encoding!r} is not accepted: send the body as {', '.join(ENCODINGS)} "
                       f"or uncompressed")
    decoder = zlib.decompressobj(wbits)
    try:
        data = decoder.decompress(body, MAX_DECODED_BYTES)
    except zlib.error as exc:
        raise invalid(f"the body is not valid {encoding} data: {exc}") from None
    if decoder.unconsumed_tail:
        raise invalid(f"the {encoding} body decompresses to more than {MAX_DECODED_BYTES} bytes: send less per "
                       f"request")
    if not decoder.eof:
        raise invalid(f"the body is not valid {encoding} data: it ends before its compressed stream does")
    return data


def _inputs(entries: Any, raw: memoryview) -> Dict[str, np.ndarray]:
    """The request's input tensors: those with parameters binary_data_size take their bytes from `raw` (the body
    after its JSON header), in order; the others carry JSON `data`."""
    if not _typed(entries, list, "'inputs'"):
        raise invalid("'inputs' must list the model's input tensors")
    inputs: Dict[str, np.ndarray] = {}
    offset = 0
    for entry in entries:
        entry = _object(entry, "each of 'inputs'")
        name = _typed(entry.get("name"), str, "an input's 'name'")
        if name in inputs:
            raise invalid(f"input {name!r} is given twice: send each input once")
        size = _parameters(entry, f"input {name!r}").get("binary_data_size")
        if size is not None:
            if _typed(size, int, f"input {name!r}: binary_data_size") < 0 or offset + size > len(raw):
                raise invalid(f"input {name!r}: binary_data_size {size} does not fit the body's binary data "
                               f"({len(raw) - offset} bytes left): send {HEADER_LENGTH} and every input's bytes")
            inputs[name] = from_raw(name, entry.get("datatype"), entry.get("shape"), raw[offset:offset + size])
            offset += size
        elif "data" in entry:
            inputs[name] = from_json(name, entry.get("datatype"), entry.get("shape"), entry["data"])
        else:
            raise invalid(f"input {name!r} has no values: give them in 'data', or as binary data with "
                           f"parameters binary_data_size")
    if offset != len(raw):
        raise invalid(f"the body holds {len(raw) - offset} bytes after its JSON header that no input's "
                       f"binary_data_size accounts for")
    return inputs


def _outputs(entries: Any) -> Tuple[List[str], Dict[str, bool]]:
    """(the outputs asked for, {output: binary_data} where an output's parameters say)."""
    outputs, binary = [], {}
    for entry in _typed(entries, list, "'outputs'"):
        entry = _object(entry, "each of 'outputs'")
        name = _typed(entry.get("name"), str, "an output's 'name'")
        parameters = _parameters(entry, f"output {name!r}")
        check_output_parameters(name, parameters)
        outputs.append(name)
        if "binary_data" in parameters:
            binary[name] = _typed(parameters["binary_data"], bool, f"output {name!r}: binary_data")
    return outputs, binary


def parse_infer(body: bytes, header_length: Optional[str], encoding: Optional[str] = None) -> InferRequest:
    """An inference request body (`header_length`: its Inference-Header-Content-Length header, `encoding`: its
    Content-Encoding, if any); raw input data is read in place."""
    body = _decoded(body, encoding)
    header = len(body)
    if header_length is not None:
        if not header_length.isdigit() or int(header_length) > len(body):
            raise invalid(f"{HEADER_LENGTH} must be the byte length of the JSON header (at most the body's "
                           f"{len(body)} bytes), got {header_length!r}")
        header = int(header_length)
    request = _object(loads(body[:header]), "the request body")
    parameters = _parameters(request, "the request")
    outputs, binary = _outputs(request.get("outputs", []))
    request_id = request.get("id")
    return InferRequest(
        id=None if request_id is None else _typed(request_id, str, "'id'"),
        signature_name=_typed(parameters.get(SIGNATURE_PARAMETER, ""), str, SIGNATURE_PARAMETER),
        inputs=_inputs(request.get("inputs"), memoryview(body)[header:]), outputs=outputs, binary=binary,
        binary_default=_typed(parameters.get("binary_data_output", False), bool, "binary_data_output"))


def infer_response(servable: Servable, request: InferRequest, outputs: Mapping[str, np.ndarray]) -> Response:
    """The answer to `request`: outputs asked for as binary data follow the JSON header as raw bytes."""
    header: Dict[str, Any] = {"model_name": servable.name, "model_version": str(servable.version)}
    if request.id is not None:
        header["id"] = request.id
    header["outputs"], chunks = [], []
    for name, array in outputs.items():
        entry = {"name": name, "datatype": datatype(array.dtype), "shape": list(array.shape)}
        if request.binary_output(name):
            chunks.append(to_raw(array))
            entry["parameters"] = {"binary_data_size": len(chunks[-1])}
        else:
            entry["data"] = to_json(name, array)
        header["outputs"].append(entry)
    text = dumps(header)
    if not chunks:
        return Response(text, media_type="application/json")
    return Response(b"".join([text, *chunks]), media_type="application/octet-stream",
                    headers={HEADER_LENGTH: str(len(text))})


def routes(service: Service, pool: RequestThreads) -> List[Route]:
    """The /v2 routes over `service`; bodies are decoded and answers encoded on `pool`'s threads, batched
    requests wait for their batch on the event loop."""

    def version(request: Request) -> Optional[int]:
        return model_version(request.path_params.get("version", ""))

    async def live(request: Request) -> Response:
        return Response()

    async def ready(request: Request) -> Response:
        return Response(status_code=200 if service.manager.ready else 400)

    async def metadata(request: Request) -> Response:
        return json_response(server_metadata())

    @answering_errors
    async def model(request: Request) -> Response:
        name = request.path_params["model"]
        with service.request(name, "kserve_rest_metadata"):
            return json_response(await pool.run(model_metadata, service, name, version(request)))

    @answering_errors
    async def model_is_ready(request: Request) -> Response:
        name = request.path_params["model"]
        with service.request(name, "kserve_rest_ready"):
            number = version(request)
            if model_ready(service, name, number):
                return Response()
            which = "" if number is None else f" version {number}"
            return json_response({"error": f"model {name!r}{which} is not loaded"}, 400)

    def submit(name: str, request: Request, body: bytes):
        """(servable, parsed request, future of its outputs); runs on a request thread."""
        parsed = parse_infer(body, request.headers.get(HEADER_LENGTH), request.headers.get("Content-Encoding"))
        servable, signature = service.resolve(name, version(request), None, parsed.signature_name)
        return servable, parsed, service.submit(servable, signature, parsed.inputs, parsed.outputs)

    @answering_errors
    async def infer(request: Request) -> Response:
        name = request.path_params["model"]
        with service.request(name, "kserve_rest_infer"):
            body = await read_body(request)
            servable, parsed, future = await pool.run(submit, name, request, body)
            outputs = await asyncio.wrap_future(future)
            return await pool.run(infer_response, servable, parsed, outputs)

    async def unknown(request: Request) -> Response:
        return json_response({"error": f"no Open Inference Protocol endpoint {request.method} {request.url.path}: "
                                       f"see GET /v2, /v2/health/{{live,ready}}, /v2/models/<m>[/versions/<v>]"
                                       f"[/ready] and POST /v2/models/<m>[/versions/<v>]/infer"}, 404)

    return [
        Route("/v2", metadata), Route("/v2/health/live", live), Route("/v2/health/ready", ready),
        *(Route(f"/v2/models/{{model}}{at}", model) for at in ("", "/versions/{version}")),
        *(Route(f"/v2/models/{{model}}{at}/ready", model_is_ready) for at in ("", "/versions/{version}")),
        *(Route(f"/v2/models/{{model}}{at}/infer", infer, methods=["POST"]) for at in ("", "/versions/{version}")),
        Route("/v2/{rest:path}", unknown, methods=["GET", "POST"]),
    ]
