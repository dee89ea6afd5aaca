"""TF Serving's gRPC services over a Service: PredictionService (Predict, GetModelMetadata) and ModelService
(GetModelStatus), with the tensorflow-serving-api protos; a ServingError aborts with its gRPC status code."""
from __future__ import annotations

import contextlib
import logging
from typing import Optional, Tuple

import grpc
from tensorflow_serving.apis import model_service_pb2_grpc, predict_pb2, prediction_service_pb2_grpc

from tftrt_py.serving.errors import Code, ServingError
from tftrt_py.serving.service import Service
from tftrt_py.serving.tensors import from_tensor_proto, to_tensor_proto

logger = logging.getLogger(__name__)

__all__ = ["add_services"]


def _version(model_spec) -> Tuple[Optional[int], Optional[str]]:
    """(version, label) a ModelSpec asks for; neither: the latest."""
    which = model_spec.WhichOneof("version_choice")
    if which == "version":
        return model_spec.version.value, None
    return None, model_spec.version_label if which == "version_label" else None


@contextlib.contextmanager
def _aborting(context: grpc.ServicerContext, service: Service, model: str, api: str):
    """Run the block as a counted request; errors abort the call with their status code."""
    try:
        with service.request(model, api):
            yield
    except ServingError as exc:
        context.abort(exc.code.grpc_code, exc.message)
    except Exception as exc:  # a bug answers INTERNAL and is logged; the server goes on
        logger.exception("gRPC %s failed", api)
        context.abort(Code.INTERNAL.grpc_code, f"{type(exc).__name__}: {exc}")


class PredictionService(prediction_service_pb2_grpc.PredictionServiceServicer):
    def __init__(self, service: Service):
        self.service = service

    def Predict(self, request, context):
        spec = request.model_spec
        with _aborting(context, self.service, spec.name, "grpc_predict"):
            servable, signature = self.service.resolve(spec.name, *_version(spec), spec.signature_name)
            arrays = {k: from_tensor_proto(k, v) for k, v in request.inputs.items()}
            outputs = self.service.predict(servable, signature, arrays, list(request.output_filter))
            response = predict_pb2.PredictResponse()
            response.model_spec.name = servable.name
            response.model_spec.version.value = servable.version
            response.model_spec.signature_name = signature.name
            for name, value in outputs.items():
                response.outputs[name].CopyFrom(to_tensor_proto(value))
            return response

    def GetModelMetadata(self, request, context):
        spec = request.model_spec
        with _aborting(context, self.service, spec.name, "grpc_metadata"):
            response, _ = self.service.metadata(spec.name, *_version(spec), fields=list(request.metadata_field))
            return response


class ModelService(model_service_pb2_grpc.ModelServiceServicer):
    def __init__(self, service: Service):
        self.service = service

    def GetModelStatus(self, request, context):
        spec = request.model_spec
        with _aborting(context, self.service, spec.name, "grpc_status"):
            return self.service.status(spec.name, *_version(spec))


def add_services(server: grpc.Server, service: Service) -> None:
    prediction_service_pb2_grpc.add_PredictionServiceServicer_to_server(PredictionService(service), server)
    model_service_pb2_grpc.add_ModelServiceServicer_to_server(ModelService(service), server)
