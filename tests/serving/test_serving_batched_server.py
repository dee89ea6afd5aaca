"""A server with batching on: concurrent REST and gRPC requests merge into padded batches that the engines
built for batches 4 and 8 serve, and each request gets its own rows, as native TF computes them."""
import concurrent.futures
import re

import grpc
import numpy as np
import tensorflow as tf
from tensorflow_serving.apis import predict_pb2, prediction_service_pb2_grpc

from conftest import metric, reference
from support import random_array

TOL = dict(rtol=1e-5, atol=1e-5)


def test_concurrent_requests_merge_and_split_back(batching_server, models):
    rest = batching_server.rest
    feeds = [random_array((n, 32, 32, 3)) for n in (1, 2, 1, 3, 1, 2, 1, 1, 2, 3)]

    def rest_call(x):
        return rest.json("/v1/models/cnn:predict", {"instances": x.tolist()})

    def grpc_call(x):
        with grpc.insecure_channel(f"127.0.0.1:{batching_server.server.grpc_port}") as channel:
            request = predict_pb2.PredictRequest()
            request.model_spec.name = "cnn"
            request.inputs["image"].CopyFrom(tf.make_tensor_proto(x))
            response = prediction_service_pb2_grpc.PredictionServiceStub(channel).Predict(request, timeout=60)
            (output,) = response.outputs.values()
            return 200, {"predictions": tf.make_ndarray(output).tolist()}

    before = rest.call("/monitoring/prometheus/metrics")[1].decode()
    with concurrent.futures.ThreadPoolExecutor(len(feeds)) as pool:
        answers = list(pool.map(lambda ix: (rest_call if ix[0] % 2 else grpc_call)(ix[1]), enumerate(feeds)))
    for x, (status, body) in zip(feeds, answers):
        assert status == 200
        (want,) = reference(models, "cnn", 1, image=x).values()
        np.testing.assert_allclose(np.array(body["predictions"]), want, **TOL)
    after = rest.call("/monitoring/prometheus/metrics")[1].decode()
    batches = metric(after, "tftrt_serving_batch_size_count", model="cnn") - \
        metric(before, "tftrt_serving_batch_size_count", model="cnn")
    rows = metric(after, "tftrt_serving_batch_size_sum", model="cnn") - \
        metric(before, "tftrt_serving_batch_size_sum", model="cnn")
    assert rows == sum(len(x) for x in feeds) and batches < len(feeds)  # requests merged
    # every padded batch ran on an engine (built for 4 and 8): no engine op of the process fell back meanwhile (the
    # counters are the live engine ops', those of models other tests loaded among them)
    before, after = fallbacks(before), fallbacks(after)
    assert after and all(count == before.get(op, 0.0) for op, count in after.items()), (before, after)


def fallbacks(text):
    """Engine op -> its native-segment runs, from a metrics exposition `text`."""
    return {op: float(v) for op, v in re.findall(r'^tftrt_engine_op_fallback_total\{engine_op="([^"]*)"\} (\S+)',
                                                 text, re.M)}


def test_batched_two_input_signature(batching_server, models):
    a, b = random_array((3, 8)), random_array((3, 8))
    status, body = batching_server.rest.json("/v1/models/pair:predict", {
        "signature_name": "pair", "inputs": {"a": a.tolist(), "b": b.tolist()}})
    assert status == 200
    for name, want in reference(models, "pair", 1, "pair", a=a, b=b).items():
        np.testing.assert_allclose(np.array(body["outputs"][name]), want, **TOL)


def test_a_request_over_max_batch_size_is_refused(batching_server):
    status, body = batching_server.rest.json("/v1/models/mlp:predict", {"inputs": random_array((9, 16)).tolist()})
    assert status == 400 and "larger than maximum input batch size 8" in body["error"]


def test_many_concurrent_grpc_predicts_each_get_their_own_rows(batching_server, models):
    """40 calls in flight on one channel (56 rows: 7 full batches, within max_enqueued_batches 10): every call
    waits on the event loop, none is refused or mixed up."""
    feeds = [random_array((n, 32, 32, 3)) for n in [1, 2, 1, 2, 1] * 8]
    with grpc.insecure_channel(f"127.0.0.1:{batching_server.server.grpc_port}") as channel:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        calls = []
        for x in feeds:
            request = predict_pb2.PredictRequest()
            request.model_spec.name = "cnn"
            request.inputs["image"].CopyFrom(tf.make_tensor_proto(x))
            calls.append(stub.Predict.future(request, timeout=60))
        answers = [tf.make_ndarray(next(iter(call.result().outputs.values()))) for call in calls]
    (want,) = reference(models, "cnn", 1, image=np.concatenate(feeds)).values()
    np.testing.assert_allclose(np.concatenate(answers), want, **TOL)
    assert [len(a) for a in answers] == [len(x) for x in feeds]


def test_the_loaded_models_are_frozen_out_of_the_garbage_collector(batching_server):
    """A full collection over TF and the models (hundreds of thousands of objects) would pause every request."""
    import gc

    assert gc.get_freeze_count() > 100_000
