"""The Open Inference Protocol's gRPC service (KServe v2: inference.GRPCInferenceService) over a Service, served
beside TF Serving's services. Its protos are those tritonclient ships (tritonclient.grpc.service_pb2 and
service_pb2_grpc, generated from the protocol's grpc_service.proto, which Triton maintains). ServerLive, ServerReady,
ModelReady, ServerMetadata, ModelMetadata and ModelInfer are served; the other RPCs of Triton's superset of the
protocol answer UNIMPLEMENTED. ModelInfer reads inputs from raw_input_contents (in place) or typed contents, and
answers raw_output_contents, as Triton does."""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Dict, Mapping

import grpc
import numpy as np
from google.protobuf import json_format
from tritonclient.grpc import service_pb2, service_pb2_grpc

from tftrt_py.serving.errors import invalid
from tftrt_py.serving.grpc_calls import aborting
from tftrt_py.serving.kserve import (SIGNATURE_PARAMETER, check_output_parameters, model_metadata, model_ready,
                                     model_version, server_metadata)
from tftrt_py.serving.kserve_tensors import datatype, from_contents, from_raw, to_raw
from tftrt_py.serving.models import Servable
from tftrt_py.serving.service import Service

__all__ = ["InferenceService", "add_service"]

SERVICE = service_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"]



def _signature_name(parameters) -> str:
    if SIGNATURE_PARAMETER not in parameters:
        return ""
    parameter = parameters[SIGNATURE_PARAMETER]
    if parameter.WhichOneof("parameter_choice") != "string_param":
        raise invalid(f"parameter {SIGNATURE_PARAMETER} must be a string_param")
    return parameter.string_param


def _inputs(request) -> Dict[str, np.ndarray]:
    """The request's input tensors: all from raw_input_contents (one per input, in order), or all from their
    typed contents."""
    raw = request.raw_input_contents
    if raw and len(raw) != len(request.inputs):
        raise invalid(f"raw_input_contents holds {len(raw)} entries for {len(request.inputs)} inputs: give one "
                       f"per input, in the order of inputs (or every input's values in its contents)")
    arrays: Dict[str, np.ndarray] = {}
    for i, tensor in enumerate(request.inputs):
        if tensor.name in arrays:
            raise invalid(f"input {tensor.name!r} is given twice: send each input once")
        shape = list(tensor.shape)
        arrays[tensor.name] = from_raw(tensor.name, tensor.datatype, shape, raw[i]) if raw else \
            from_contents(tensor.name, tensor.datatype, shape, tensor.contents)
    return arrays


def _response(servable: Servable, request_id: str, outputs: Mapping[str, np.ndarray]):
    response = service_pb2.ModelInferResponse(model_name=servable.name, model_version=str(servable.version),
                                              id=request_id)
    for name, array in outputs.items():
        response.outputs.add(name=name, datatype=datatype(array.dtype), shape=array.shape)
        response.raw_output_contents.append(to_raw(array))
    return response


class InferenceService(service_pb2_grpc.GRPCInferenceServiceServicer):
    """ModelInfer runs unbatched models on `executor`; batched ones await their batch on the event loop."""

    def __init__(self, service: Service, executor: ThreadPoolExecutor):
        self.service, self.executor = service, executor

    async def ServerLive(self, request, context):
        return service_pb2.ServerLiveResponse(live=True)

    async def ServerReady(self, request, context):
        return service_pb2.ServerReadyResponse(ready=self.service.manager.ready)

    async def ServerMetadata(self, request, context):
        return json_format.ParseDict(server_metadata(), service_pb2.ServerMetadataResponse())

    async def ModelReady(self, request, context):
        async with aborting(context, self.service, request.name, "kserve_grpc_ready"):
            ready = model_ready(self.service, request.name, model_version(request.version))
            return service_pb2.ModelReadyResponse(ready=ready)

    async def ModelMetadata(self, request, context):
        async with aborting(context, self.service, request.name, "kserve_grpc_metadata"):
            metadata = model_metadata(self.service, request.name, model_version(request.version))
            return json_format.ParseDict(metadata, service_pb2.ModelMetadataResponse())

    async def ModelInfer(self, request, context):
        async with aborting(context, self.service, request.model_name, "kserve_grpc_infer"):
            servable, signature = self.service.resolve(request.model_name, model_version(request.model_version),
                                                       None, _signature_name(request.parameters))
            for output in request.outputs:
                check_output_parameters(output.name, output.parameters)
            outputs = await self.service.predict(servable, signature, _inputs(request),
                                                 [o.name for o in request.outputs], executor=self.executor)
            return _response(servable, request.id, outputs)


SERVED = [m.name for m in SERVICE.methods if m.name in vars(InferenceService)]


def _unimplemented(method: str):
    async def answer(self, request, context):
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, f"{method} is not served: tftrt-serve serves "
                                                           f"{', '.join(SERVED)} of inference.GRPCInferenceService")
    return answer


for _method in SERVICE.methods:  # Triton's extensions: streaming, repository, statistics, shared memory, ...
    if _method.name not in SERVED:
        setattr(InferenceService, _method.name, _unimplemented(_method.name))


def add_service(server: grpc.aio.Server, service: Service, executor: ThreadPoolExecutor) -> None:
    service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(InferenceService(service, executor), server)
