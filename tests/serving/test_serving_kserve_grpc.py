"""The Open Inference Protocol's gRPC service (inference.GRPCInferenceService) on tftrt-serve's gRPC port, through
tritonclient.grpc and its generated stub: liveness, readiness, metadata, ModelInfer with raw and typed contents
answering what native TF and TF Serving's Predict answer, errors as gRPC status codes (the server serving on after
each), UNIMPLEMENTED for the rest of Triton's RPCs, metrics, and batching."""
import contextlib
from concurrent.futures import Future

import grpc
import numpy as np
import pytest
import tensorflow as tf
import tritonclient.grpc as grpcclient
from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException, np_to_triton_dtype

from conftest import assert_batched, assert_counted_by_outcome, reference
from support import random_array

TOL = dict(rtol=1e-5, atol=1e-5)


def _client(running):
    return contextlib.closing(grpcclient.InferenceServerClient(f"127.0.0.1:{running.server.grpc_port}"))


@pytest.fixture(scope="module")
def client(server):
    with _client(server) as opened:
        yield opened


@pytest.fixture(scope="module")
def stub(server):
    with grpc.insecure_channel(f"127.0.0.1:{server.server.grpc_port}") as channel:
        yield service_pb2_grpc.GRPCInferenceServiceStub(channel)


def infer_input(name, array):
    tensor = grpcclient.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
    tensor.set_data_from_numpy(array)
    return tensor


def test_liveness_readiness_and_server_metadata(client):
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready("mlp") and client.is_model_ready("mlp", "1")
    assert not client.is_model_ready("mlp", "9") and not client.is_model_ready("nope")
    metadata = client.get_server_metadata()
    assert (metadata.name, metadata.version, list(metadata.extensions)) == ("tftrt-serve", "0.1.0",
                                                                             ["binary_tensor_data"])


def test_model_metadata_describes_the_serving_signature(client):
    assert client.get_model_metadata("mlp", as_json=True) == {
        "name": "mlp", "versions": ["1", "2"], "platform": "tensorflow_savedmodel",
        "inputs": [{"name": "features", "datatype": "FP32", "shape": ["-1", "16"]}],
        "outputs": [{"name": "logits", "datatype": "FP32", "shape": ["-1", "10"]},
                    {"name": "scores", "datatype": "FP32", "shape": ["-1", "10"]}]}
    assert list(client.get_model_metadata("cnn", "1").inputs[0].shape) == [-1, 32, 32, 3]
    with pytest.raises(InferenceServerException) as info:
        client.get_model_metadata("nope")
    assert info.value.status() == "StatusCode.NOT_FOUND" and "Latest(nope)" in info.value.message()


def test_infer_matches_native_tf_and_tf_serving_predict(client, server, models):
    x = random_array((5, 32, 32, 3))
    result = client.infer("cnn", [infer_input("image", x)], request_id="request-9")
    (name, want), = reference(models, "cnn", 1, image=x).items()
    answer = result.get_response()
    assert (answer.id, answer.model_name, answer.model_version) == ("request-9", "cnn", "1")
    assert [(o.name, o.datatype, list(o.shape)) for o in answer.outputs] == [(name, "FP32", list(want.shape))]
    np.testing.assert_allclose(result.as_numpy(name), want, **TOL)
    with grpc.insecure_channel(f"127.0.0.1:{server.server.grpc_port}") as channel:
        request = predict_pb2.PredictRequest()
        request.model_spec.name = "cnn"
        request.inputs["image"].CopyFrom(tf.make_tensor_proto(x))
        predicted = prediction_service_pb2_grpc.PredictionServiceStub(channel).Predict(request, timeout=60)
    np.testing.assert_allclose(result.as_numpy(name), tf.make_ndarray(predicted.outputs[name]), **TOL)


def test_versions_requested_outputs_and_a_named_signature(client, models):
    x = random_array((2, 16))
    for version in ("1", "2"):
        result = client.infer("mlp", [infer_input("features", x)], model_version=version,
                              outputs=[grpcclient.InferRequestedOutput("scores")])
        assert [o.name for o in result.get_response().outputs] == ["scores"]
        np.testing.assert_allclose(result.as_numpy("scores"),
                                   reference(models, "mlp", int(version), features=x)["scores"], **TOL)
    a, b = random_array((3, 8)), random_array((3, 8))
    result = client.infer("pair", [infer_input("a", a), infer_input("b", b)], parameters={"signature_name": "pair"})
    for name, want in reference(models, "pair", 1, "pair", a=a, b=b).items():
        np.testing.assert_allclose(result.as_numpy(name), want, **TOL)


def test_typed_contents_as_inputs(stub, models):
    x = random_array((2, 16))
    request = service_pb2.ModelInferRequest(model_name="mlp", model_version="1")
    request.inputs.add(name="features", datatype="FP32", shape=[2, 16]).contents.fp32_contents.extend(x.reshape(-1))
    response = stub.ModelInfer(request, timeout=60)
    assert [o.name for o in response.outputs] == ["logits", "scores"] and len(response.raw_output_contents) == 2
    np.testing.assert_allclose(np.frombuffer(response.raw_output_contents[0], np.float32).reshape(2, 10),
                               reference(models, "mlp", 1, features=x)["logits"], **TOL)


def test_bytes_int64_and_bool_tensors(typed_server):
    text = np.array([b"ab", b"\xff\x00", b""], dtype=object)
    count = np.array([[1, -2], [3, 2 ** 40], [0, 5]], np.int64)
    flag = np.array([True, False, True])
    with _client(typed_server) as client:
        result = client.infer("typed", [infer_input("text", text), infer_input("count", count),
                                        infer_input("flag", flag)])
    assert list(result.as_numpy("upper")) == [b"AB", b"\xff\x00", b""]
    np.testing.assert_array_equal(result.as_numpy("doubled"), count * 2)
    np.testing.assert_array_equal(result.as_numpy("negated"), ~flag)


def _request(model="mlp", name="features", shape=(1, 16), datatype="FP32", raw=None, version=""):
    request = service_pb2.ModelInferRequest(model_name=model, model_version=version)
    request.inputs.add(name=name, datatype=datatype, shape=shape)
    request.raw_input_contents.append(random_array(shape).tobytes() if raw is None else raw)
    return request


@pytest.mark.parametrize("request_, code, message", [
    (lambda: _request(model="nope"), grpc.StatusCode.NOT_FOUND, "Latest(nope)"),
    (lambda: _request(version="5"), grpc.StatusCode.NOT_FOUND, "Specific(mlp, 5)"),
    (lambda: _request(version="v1"), grpc.StatusCode.INVALID_ARGUMENT, "not a whole number"),
    (lambda: _request(shape=(1, 12)), grpc.StatusCode.INVALID_ARGUMENT, "expects shape float32[?,16]"),
    (lambda: _request(datatype="FP64", raw=random_array((1, 16), "float64").tobytes()),
     grpc.StatusCode.INVALID_ARGUMENT, "expects float32"),
    (lambda: _request(raw=b"\0" * 60), grpc.StatusCode.INVALID_ARGUMENT, "60 bytes of raw data"),
    (lambda: _request(name="x"), grpc.StatusCode.INVALID_ARGUMENT, "input tensor alias not found"),
    (lambda: _request(model="pair", name="a", shape=(1, 8)), grpc.StatusCode.INVALID_ARGUMENT,
     '"serving_default" not found'),
    (lambda: service_pb2.ModelInferRequest(model_name="mlp"), grpc.StatusCode.INVALID_ARGUMENT, "missing input"),
])
def test_bad_requests_get_status_codes_and_the_server_serves_on(stub, models, request_, code, message):
    with pytest.raises(grpc.RpcError) as info:
        stub.ModelInfer(request_(), timeout=60)
    assert info.value.code() == code and message in info.value.details()
    x = random_array((1, 16))
    response = stub.ModelInfer(_request(raw=x.tobytes()), timeout=60)
    np.testing.assert_allclose(np.frombuffer(response.raw_output_contents[1], np.float32).reshape(1, 10),
                               reference(models, "mlp", 2, features=x)["scores"], **TOL)


def test_the_classification_extension_is_unimplemented(client):
    with pytest.raises(InferenceServerException) as info:
        client.infer("mlp", [infer_input("features", random_array((1, 16)))],
                     outputs=[grpcclient.InferRequestedOutput("scores", class_count=3)])
    assert info.value.status() == "StatusCode.UNIMPLEMENTED"
    assert "classification extension is not served" in info.value.message()


def test_the_rest_of_tritons_rpcs_are_unimplemented(client, stub):
    with pytest.raises(InferenceServerException) as info:
        client.get_model_config("mlp")
    assert info.value.status() == "StatusCode.UNIMPLEMENTED"
    assert "ModelConfig is not served: tftrt-serve serves ServerLive" in info.value.message()
    with pytest.raises(grpc.RpcError) as streamed:
        list(stub.ModelStreamInfer(iter([_request()]), timeout=60))
    assert streamed.value.code() == grpc.StatusCode.UNIMPLEMENTED


def test_requests_are_counted_by_outcome(client, server):
    client.infer("mlp", [infer_input("features", random_array((1, 16)))])
    with pytest.raises(InferenceServerException):
        client.infer("mlp", [infer_input("features", random_array((1, 16), "float64"))])
    client.get_model_metadata("mlp")
    assert_counted_by_outcome(server, "kserve_grpc")


def test_concurrent_infers_merge_into_batches(batching_server, models):
    feeds = [random_array((n, 32, 32, 3)) for n in (1, 2, 1, 3, 1, 2)]
    before = batching_server.rest.call("/monitoring/prometheus/metrics")[1].decode()
    futures = [Future() for _ in feeds]
    with _client(batching_server) as client:
        for x, future in zip(feeds, futures):
            client.async_infer("cnn", [infer_input("image", x)], client_timeout=60,
                               callback=lambda result, error, f=future: f.set_exception(error) if error else
                               f.set_result(result))
        answers = [future.result(60) for future in futures]
    assert_batched(models, batching_server, feeds, answers, before)
