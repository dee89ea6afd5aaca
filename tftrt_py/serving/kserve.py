"""What both front ends of the Open Inference Protocol (KServe v2: REST under /v2, gRPC's
inference.GRPCInferenceService) answer over a Service: server and model metadata, model readiness, and model
versions as the protocol writes them (strings; "" for the latest). A model's inputs and outputs are those of its
serving signature: "serving_default", or the one an inference request names in its `signature_name` parameter."""
from __future__ import annotations

from typing import Any, Dict, Optional

from tftrt_py import __version__
from tftrt_py.serving.errors import Code, ServingError
from tftrt_py.serving.kserve_tensors import datatype
from tftrt_py.serving.models import TensorSpec
from tftrt_py.serving.service import Service

__all__ = ["SIGNATURE_PARAMETER", "model_version", "check_output_parameters", "server_metadata", "model_metadata",
           "model_ready"]

SERVER_NAME = "tftrt-serve"
PLATFORM = "tensorflow_savedmodel"  # Triton's name for the TensorFlow SavedModel platform
EXTENSIONS = ("binary_tensor_data",)
#: the inference request parameter naming the signature to run (default serving_default)
SIGNATURE_PARAMETER = "signature_name"


def model_version(text: str) -> Optional[int]:
    """A request's model version: "" is the latest loaded, else a whole number."""
    if text == "":
        return None
    if not text.isdigit():
        raise ServingError(Code.INVALID_ARGUMENT, f"model version {text!r} is not a whole number: give a version "
                                                  f"number, or none for the latest")
    return int(text)


def check_output_parameters(name: str, parameters) -> None:
    """UNIMPLEMENTED for a requested output's parameters that ask for what is not served: the classification
    extension (the top classes instead of the tensor)."""
    if "classification" in parameters:
        raise ServingError(Code.UNIMPLEMENTED, f"output {name!r}: the classification extension is not served: ask "
                                               f"for the output tensor without parameters classification")


def server_metadata() -> Dict[str, Any]:
    return {"name": SERVER_NAME, "version": __version__, "extensions": list(EXTENSIONS)}


def _tensor(name: str, spec: TensorSpec) -> Dict[str, Any]:
    """A tensor's metadata: -1 for each unknown dimension ([-1] for an unknown rank)."""
    shape = [-1] if spec.shape is None else [-1 if d is None else d for d in spec.shape]
    return {"name": name, "datatype": datatype(spec.dtype), "shape": shape}


def model_metadata(service: Service, model: str, version: Optional[int]) -> Dict[str, Any]:
    """The serving signature of the model's `version` (None: the latest), with the model's loaded versions."""
    servable, signature = service.resolve(model, version, None, "")
    versions = [str(s.version) for s in service.manager.status(model) if s.state == "AVAILABLE"]
    return {"name": servable.name, "versions": versions, "platform": PLATFORM,
            "inputs": [_tensor(k, v) for k, v in signature.inputs.items()],
            "outputs": [_tensor(k, v) for k, v in signature.outputs.items()]}


def model_ready(service: Service, model: str, version: Optional[int]) -> bool:
    """Whether the model's `version` (None: any) is loaded; unknown models are not ready."""
    try:
        service.manager.servable(model, version)
    except ServingError as exc:
        if exc.code is Code.NOT_FOUND:
            return False
        raise
    return True
