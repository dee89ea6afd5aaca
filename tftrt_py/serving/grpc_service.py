"""TF Serving's gRPC services over a Service: PredictionService (Predict, GetModelMetadata) and ModelService
(GetModelStatus), with the tensorflow-serving-api protos, beside the Open Inference Protocol's (kserve_grpc), on an
asyncio gRPC server (grpc.aio) in a thread of its own: a batched Predict awaits its batch on the event loop instead
of holding a thread; an unbatched one runs its model on a thread pool. A ServingError aborts with its gRPC status
code."""
from __future__ import annotations

import asyncio
import errno
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Optional, Tuple

import grpc
from tensorflow_serving.apis import model_service_pb2_grpc, predict_pb2, prediction_service_pb2_grpc

from tftrt_py.serving import kserve_grpc
from tftrt_py.serving.grpc_calls import aborting
from tftrt_py.serving.service import Service
from tftrt_py.serving.tensors import fill_tensor_proto, from_tensor_proto

__all__ = ["GrpcServer", "add_services"]

MAX_MESSAGE = 2 ** 31 - 1  # TF Serving takes requests of any size


def _version(model_spec) -> Tuple[Optional[int], Optional[str]]:
    """(version, label) a ModelSpec asks for; neither: the latest."""
    which = model_spec.WhichOneof("version_choice")
    if which == "version":
        return model_spec.version.value, None
    return None, model_spec.version_label if which == "version_label" else None


class PredictionService(prediction_service_pb2_grpc.PredictionServiceServicer):
    """Predict runs unbatched models on `executor`."""

    def __init__(self, service: Service, executor: ThreadPoolExecutor):
        self.service, self.executor = service, executor

    async def Predict(self, request, context):
        spec = request.model_spec
        async with aborting(context, self.service, spec.name, "grpc_predict"):
            servable, signature = self.service.resolve(spec.name, *_version(spec), spec.signature_name)
            arrays = {k: from_tensor_proto(k, v) for k, v in request.inputs.items()}
            outputs = await self.service.predict(servable, signature, arrays, list(request.output_filter),
                                                 executor=self.executor)
            response = predict_pb2.PredictResponse()
            response.model_spec.name = servable.name
            response.model_spec.version.value = servable.version
            response.model_spec.signature_name = signature.name
            for name, value in outputs.items():
                fill_tensor_proto(response.outputs[name], value)
            return response

    async def GetModelMetadata(self, request, context):
        spec = request.model_spec
        async with aborting(context, self.service, spec.name, "grpc_metadata"):
            response, _ = self.service.metadata(spec.name, *_version(spec), fields=list(request.metadata_field))
            return response


class ModelService(model_service_pb2_grpc.ModelServiceServicer):
    def __init__(self, service: Service):
        self.service = service

    async def GetModelStatus(self, request, context):
        spec = request.model_spec
        async with aborting(context, self.service, spec.name, "grpc_status"):
            return self.service.status(spec.name, *_version(spec))


def add_services(server: grpc.aio.Server, service: Service, executor: ThreadPoolExecutor) -> None:
    """TF Serving's services and the Open Inference Protocol's GRPCInferenceService, on one server."""
    prediction_service_pb2_grpc.add_PredictionServiceServicer_to_server(PredictionService(service, executor), server)
    model_service_pb2_grpc.add_ModelServiceServicer_to_server(ModelService(service), server)
    kserve_grpc.add_service(server, service, executor)


class GrpcServer:
    """The gRPC API of `service` on `host:port` (0: an ephemeral port; `port` holds the bound one after
    start()), served by an event loop in its own thread; unbatched predicts run on `threads` threads."""

    def __init__(self, service: Service, host: str, port: int, threads: int = 64):
        self.service, self.host, self.port, self._threads = service, host, port, threads
        self._loop = self._thread = self._server = self._executor = None

    def start(self) -> "GrpcServer":
        self._executor = ThreadPoolExecutor(self._threads, thread_name_prefix="tftrt-serve-grpc")
        self._loop = asyncio.new_event_loop()
        self._loop.set_exception_handler(self._exception)
        self._stopping = False
        self._thread = threading.Thread(target=self._loop.run_forever, name="tftrt-serve-grpc-loop", daemon=True)
        self._thread.start()
        self._server, self.port = asyncio.run_coroutine_threadsafe(self._start(), self._loop).result()
        return self

    async def _start(self):
        server = grpc.aio.server(options=[("grpc.max_receive_message_length", MAX_MESSAGE),
                                          ("grpc.max_send_message_length", MAX_MESSAGE)])
        add_services(server, self.service, self._executor)
        address = f"[{self.host}]" if ":" in self.host else self.host
        port = server.add_insecure_port(f"{address}:{self.port}")
        if not port:
            raise RuntimeError(f"gRPC could not bind {self.host}:{self.port}")
        await server.start()
        return server, port

    def _exception(self, loop: asyncio.AbstractEventLoop, context: dict) -> None:
        """The loop's errors, but one grpc.aio raises while it shuts down: its poller's read event, still queued
        on the loop, finds the poller's socket closed (EBADF)."""
        exc = context.get("exception")
        if self._stopping and isinstance(exc, OSError) and exc.errno == errno.EBADF:
            return
        loop.default_exception_handler(context)

    def stop(self, grace: float = 1.0) -> None:
        """Stop listening; calls still running after `grace` seconds are cancelled."""
        self._stopping = True
        if self._server is not None:
            asyncio.run_coroutine_threadsafe(self._server.stop(grace), self._loop).result()
            self._server = None
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join()
            self._loop.close()
            self._loop = self._thread = None
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None
