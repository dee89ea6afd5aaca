"""TF Serving's gRPC API through tensorflow_serving.apis stubs over loopback: Predict, GetModelMetadata,
GetModelStatus; errors as gRPC status codes."""
import grpc
import numpy as np
import pytest
import tensorflow as tf
from tensorflow_serving.apis import (get_model_metadata_pb2, get_model_status_pb2, model_service_pb2_grpc,
                                     predict_pb2, prediction_service_pb2_grpc)

from conftest import reference
from support import random_array

TOL = dict(rtol=1e-5, atol=1e-5)


@pytest.fixture(scope="module")
def channel(server):
    with grpc.insecure_channel(f"127.0.0.1:{server.server.grpc_port}") as opened:
        yield opened


def predict_request(model, inputs, version=None, signature=""):
    request = predict_pb2.PredictRequest()
    request.model_spec.name = model
    request.model_spec.signature_name = signature
    if version is not None:
        request.model_spec.version.value = version
    for name, value in inputs.items():
        request.inputs[name].CopyFrom(tf.make_tensor_proto(value))
    return request


def test_predict_matches_native_tf(channel, models):
    stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
    x = random_array((5, 32, 32, 3))
    response = stub.Predict(predict_request("cnn", {"image": x}), timeout=60)
    (name, want), = reference(models, "cnn", 1, image=x).items()
    np.testing.assert_allclose(tf.make_ndarray(response.outputs[name]), want, **TOL)
    assert (response.model_spec.name, response.model_spec.version.value) == ("cnn", 1)
    assert response.model_spec.signature_name == "serving_default"


def test_predict_named_signature_version_and_output_filter(channel, models):
    stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
    a, b = random_array((3, 8)), random_array((3, 8))
    response = stub.Predict(predict_request("pair", {"a": a, "b": b}, signature="pair"), timeout=60)
    for name, want in reference(models, "pair", 1, "pair", a=a, b=b).items():
        np.testing.assert_allclose(tf.make_ndarray(response.outputs[name]), want, **TOL)
    x = random_array((2, 16))
    request = predict_request("mlp", {"features": x}, version=1)
    request.output_filter.append("logits")
    response = stub.Predict(request, timeout=60)
    assert list(response.outputs) == ["logits"] and response.model_spec.version.value == 1
    np.testing.assert_allclose(tf.make_ndarray(response.outputs["logits"]),
                               reference(models, "mlp", 1, features=x)["logits"], **TOL)


@pytest.mark.parametrize("request_, code", [
    (lambda: predict_request("nope", {"features": random_array((1, 16))}), grpc.StatusCode.NOT_FOUND),
    (lambda: predict_request("mlp", {"features": random_array((1, 16))}, version=5), grpc.StatusCode.NOT_FOUND),
    (lambda: predict_request("mlp", {"features": random_array((1, 16), "float64")}), grpc.StatusCode.INVALID_ARGUMENT),
    (lambda: predict_request("mlp", {"features": random_array((1, 12))}), grpc.StatusCode.INVALID_ARGUMENT),
    (lambda: predict_request("mlp", {"x": random_array((1, 16))}), grpc.StatusCode.INVALID_ARGUMENT),
    (lambda: predict_request("mlp", {"features": random_array((1, 16))}, signature="nope"),
     grpc.StatusCode.INVALID_ARGUMENT),
])
def test_bad_predicts_get_status_codes_and_the_server_serves_on(channel, models, request_, code):
    stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
    with pytest.raises(grpc.RpcError) as info:
        stub.Predict(request_(), timeout=60)
    assert info.value.code() == code and info.value.details()
    x = random_array((1, 16))
    response = stub.Predict(predict_request("mlp", {"features": x}), timeout=60)
    np.testing.assert_allclose(tf.make_ndarray(response.outputs["scores"]),
                               reference(models, "mlp", 2, features=x)["scores"], **TOL)


def test_get_model_metadata(channel):
    stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
    request = get_model_metadata_pb2.GetModelMetadataRequest()
    request.model_spec.name = "mlp"
    request.metadata_field.append("signature_def")
    response = stub.GetModelMetadata(request, timeout=60)
    signatures = get_model_metadata_pb2.SignatureDefMap()
    assert response.metadata["signature_def"].Unpack(signatures)
    assert list(signatures.signature_def["serving_default"].inputs) == ["features"]
    assert response.model_spec.version.value == 2
    request.metadata_field[0] = "other"
    with pytest.raises(grpc.RpcError) as info:
        stub.GetModelMetadata(request, timeout=60)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_get_model_status(channel):
    stub = model_service_pb2_grpc.ModelServiceStub(channel)
    request = get_model_status_pb2.GetModelStatusRequest()
    request.model_spec.name = "mlp"
    response = stub.GetModelStatus(request, timeout=60)
    assert [(s.version, s.state) for s in response.model_version_status] == [
        (1, get_model_status_pb2.ModelVersionStatus.AVAILABLE), (2, get_model_status_pb2.ModelVersionStatus.AVAILABLE)]
    request.model_spec.name = "nope"
    with pytest.raises(grpc.RpcError) as info:
        stub.GetModelStatus(request, timeout=60)
    assert info.value.code() == grpc.StatusCode.NOT_FOUND
