"""TF Serving's gRPC API through tensorflow_serving.apis stubs over loopback: Predict, GetModelMetadata,
GetModelStatus; errors as gRPC status codes; batched calls waiting on the event loop: a full queue answers
UNAVAILABLE, a client that gives up leaves the server serving."""
import threading
import time
import types

import grpc
import numpy as np
import pytest
import tensorflow as tf
from tensorflow_serving.apis import (get_model_metadata_pb2, get_model_status_pb2, model_service_pb2_grpc,
                                     predict_pb2, prediction_service_pb2_grpc)

from conftest import metric, reference, specs
from support import random_array
from tftrt_py.serving.batching import BatchScheduler
from tftrt_py.serving.config import BatchingOptions
from tftrt_py.serving.grpc_service import GrpcServer
from tftrt_py.serving.models import ModelManager
from tftrt_py.serving.service import Service

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


class GatedScheduler(BatchScheduler):
    """Batches wait for `gate` before running; `started` is set when one waits there."""

    gate, started = threading.Event(), threading.Event()

    def submit(self, queue_id, run, arrays, label="", loop=None):
        return super().submit(queue_id, self._gated(run), arrays, label, loop)

    def _gated(self, run):
        def gated(arrays):
            self.started.set()
            self.gate.wait(30)
            return run(arrays)
        return gated


@pytest.fixture
def gated(models):
    """A gRPC server over batching that holds each batch (of at most 1 row, one queued) until the gate opens."""
    GatedScheduler.gate.clear()
    GatedScheduler.started.clear()
    options = BatchingOptions(max_batch_size=1, max_enqueued_batches=1, num_batch_threads=1)
    service = Service(ModelManager(specs(models.root)), options, scheduler=GatedScheduler)
    service.manager.load()
    server = GrpcServer(service, "127.0.0.1", 0).start()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
            yield types.SimpleNamespace(service=service, stub=stub)
    finally:
        GatedScheduler.gate.set()
        server.stop()
        service.close()


def _wait_for_queued(service, depth):
    deadline = time.monotonic() + 10
    while service.scheduler.queue_depths().get("mlp", 0) != depth and time.monotonic() < deadline:
        time.sleep(0.01)
    assert service.scheduler.queue_depths().get("mlp", 0) == depth


def test_a_full_batch_queue_answers_unavailable_and_the_waiting_requests_are_served(gated, models):
    feeds = [random_array((1, 16)) for _ in range(2)]
    running = gated.stub.Predict.future(predict_request("mlp", {"features": feeds[0]}), timeout=60)
    assert GatedScheduler.started.wait(10)  # taken by the batch thread, held at the gate
    queued = gated.stub.Predict.future(predict_request("mlp", {"features": feeds[1]}), timeout=60)
    _wait_for_queued(gated.service, 1)
    with pytest.raises(grpc.RpcError) as info:
        gated.stub.Predict(predict_request("mlp", {"features": random_array((1, 16))}), timeout=60)
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE and "full" in info.value.details()
    GatedScheduler.gate.set()
    for x, call in zip(feeds, (running, queued)):
        np.testing.assert_allclose(tf.make_ndarray(call.result().outputs["scores"]),
                                   reference(models, "mlp", 2, features=x)["scores"], **TOL)


def test_a_client_giving_up_on_its_batch_leaves_the_server_serving(gated, models):
    with pytest.raises(grpc.RpcError) as info:
        gated.stub.Predict(predict_request("mlp", {"features": random_array((1, 16))}), timeout=0.3)
    assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    GatedScheduler.gate.set()
    x = random_array((1, 16))
    response = gated.stub.Predict(predict_request("mlp", {"features": x}), timeout=60)
    np.testing.assert_allclose(tf.make_ndarray(response.outputs["scores"]),
                               reference(models, "mlp", 2, features=x)["scores"], **TOL)
    text = gated.service.metrics.exposition().decode()
    assert metric(text, "tftrt_serving_requests_total", model="mlp", api="grpc_predict", status="CANCELLED") == 1
