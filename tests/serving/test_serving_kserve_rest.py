"""The Open Inference Protocol's REST API (KServe v2) through tritonclient.http and plain HTTP: health, server and
model metadata, readiness by version, inference with binary and JSON tensors (compressed bodies too) answering what
native TF and the TF Serving API answer, named signatures and requested outputs, errors as {"error": ...} with their
HTTP status (the server serving on after each), metrics, and batching."""
import contextlib
import gzip
import json
import zlib

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException, np_to_triton_dtype

from conftest import assert_batched, assert_counted_by_outcome, reference
from support import random_array
from tftrt_py.serving import kserve_rest
from tftrt_py.serving.errors import ServingError

TOL = dict(rtol=1e-5, atol=1e-5)


def _client(running, concurrency=1):
    return contextlib.closing(httpclient.InferenceServerClient(f"127.0.0.1:{running.server.rest_port}",
                                                               concurrency=concurrency))


@pytest.fixture(scope="module")
def client(server):
    with _client(server) as opened:
        yield opened


def infer_input(name, array, binary=True):
    tensor = httpclient.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
    tensor.set_data_from_numpy(array, binary_data=binary)
    return tensor


def test_health_and_server_metadata(client, server):
    assert client.is_server_live() and client.is_server_ready()
    assert server.rest.call("/v2/health/live") == (200, b"")
    assert client.get_server_metadata() == {"name": "tftrt-serve", "version": "0.1.0",
                                            "extensions": ["binary_tensor_data"]}


def test_model_metadata_describes_the_serving_signature(client):
    assert client.get_model_metadata("mlp") == {
        "name": "mlp", "versions": ["1", "2"], "platform": "tensorflow_savedmodel",
        "inputs": [{"name": "features", "datatype": "FP32", "shape": [-1, 16]}],
        "outputs": [{"name": "logits", "datatype": "FP32", "shape": [-1, 10]},
                    {"name": "scores", "datatype": "FP32", "shape": [-1, 10]}]}
    assert client.get_model_metadata("mlp", "1")["inputs"][0]["name"] == "features"
    assert client.get_model_metadata("cnn")["inputs"] == [{"name": "image", "datatype": "FP32",
                                                           "shape": [-1, 32, 32, 3]}]


def test_model_readiness_by_version(client, server):
    assert client.is_model_ready("mlp") and client.is_model_ready("mlp", "1") and client.is_model_ready("mlp", "2")
    assert not client.is_model_ready("mlp", "9") and not client.is_model_ready("nope")
    status, body = server.rest.json("/v2/models/mlp/versions/9/ready")
    assert status == 400 and body == {"error": "model 'mlp' version 9 is not loaded"}


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_infer_matches_native_tf_and_the_tf_serving_api(client, server, models, binary):
    x = random_array((4, 32, 32, 3))
    (name, want), = reference(models, "cnn", 1, image=x).items()
    outputs = None if binary else [httpclient.InferRequestedOutput(name, binary_data=False)]  # None: all, binary
    result = client.infer("cnn", [infer_input("image", x, binary)], request_id="request-7", outputs=outputs)
    answer = result.get_response()
    assert answer["id"] == "request-7" and (answer["model_name"], answer["model_version"]) == ("cnn", "1")
    assert [(o["name"], o["datatype"], o["shape"]) for o in answer["outputs"]] == [(name, "FP32", list(want.shape))]
    assert ("data" in answer["outputs"][0]) is not binary
    np.testing.assert_allclose(result.as_numpy(name), want, **TOL)
    status, predicted = server.rest.json("/v1/models/cnn:predict", {"inputs": x.tolist()})
    assert status == 200
    np.testing.assert_allclose(result.as_numpy(name), np.array(predicted["outputs"]), **TOL)


def test_versions_requested_outputs_and_a_named_signature(client, models):
    x = random_array((2, 16))
    for version in ("1", "2"):
        result = client.infer("mlp", [infer_input("features", x)], model_version=version,
                              outputs=[httpclient.InferRequestedOutput("logits")])
        assert [o["name"] for o in result.get_response()["outputs"]] == ["logits"]
        np.testing.assert_allclose(result.as_numpy("logits"),
                                   reference(models, "mlp", int(version), features=x)["logits"], **TOL)
    a, b = random_array((3, 8)), random_array((3, 8))
    result = client.infer("pair", [infer_input("a", a), infer_input("b", b)], parameters={"signature_name": "pair"})
    for name, want in reference(models, "pair", 1, "pair", a=a, b=b).items():
        np.testing.assert_allclose(result.as_numpy(name), want, **TOL)


@pytest.mark.parametrize("compression", ["gzip", "deflate"])
def test_compressed_request_bodies(client, models, compression):
    x = random_array((2, 16))
    result = client.infer("mlp", [infer_input("features", x)], request_compression_algorithm=compression)
    np.testing.assert_allclose(result.as_numpy("scores"), reference(models, "mlp", 2, features=x)["scores"], **TOL)


def test_the_classification_extension_is_unimplemented(client):
    with pytest.raises(InferenceServerException) as info:
        client.infer("mlp", [infer_input("features", random_array((1, 16)))],
                     outputs=[httpclient.InferRequestedOutput("scores", class_count=3)])
    assert info.value.status() == "501" and "classification extension is not served" in info.value.message()


def test_nested_json_data_answers_flattened_json(server, models):
    x = random_array((2, 16))
    status, body = server.rest.json("/v2/models/mlp/infer", {
        "inputs": [{"name": "features", "shape": [2, 16], "datatype": "FP32", "data": x.tolist()}],
        "outputs": [{"name": "scores"}]})
    assert status == 200 and "id" not in body
    (output,) = body["outputs"]
    assert (output["name"], output["shape"], len(output["data"])) == ("scores", [2, 10], 20)
    np.testing.assert_allclose(np.reshape(output["data"], (2, 10)), reference(models, "mlp", 2, features=x)["scores"],
                               **TOL)


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_bytes_int64_and_bool_tensors(typed_server, binary):
    text = np.array([b"ab", "é".encode(), b""], dtype=object)
    count = np.array([[1, -2], [3, 2 ** 40], [0, 5]], np.int64)
    flag = np.array([True, False, True])
    with _client(typed_server) as client:
        metadata = client.get_model_metadata("typed")
        result = client.infer("typed", [infer_input("text", text, binary), infer_input("count", count, binary),
                                        infer_input("flag", flag, binary)],
                              outputs=[httpclient.InferRequestedOutput(n, binary_data=binary)
                                       for n in ("upper", "doubled", "negated")])
    assert metadata["inputs"] == [{"name": "count", "datatype": "INT64", "shape": [-1, 2]},
                                  {"name": "flag", "datatype": "BOOL", "shape": [-1]},
                                  {"name": "text", "datatype": "BYTES", "shape": [-1]}]
    upper = [v.encode() if isinstance(v, str) else v for v in result.as_numpy("upper")]  # JSON: str, binary: bytes
    assert upper == [b"AB", "é".encode(), b""]  # TF upper-cases ASCII only
    np.testing.assert_array_equal(result.as_numpy("doubled"), count * 2)
    np.testing.assert_array_equal(result.as_numpy("negated"), ~flag)


INPUT = {"name": "features", "shape": [1, 16], "datatype": "FP32", "data": [1.0] * 16}


@pytest.mark.parametrize("path, body, code, message", [
    ("/v2/models/nope/infer", {"inputs": [INPUT]}, 404, "Servable not found for request: Latest(nope)"),
    ("/v2/models/mlp/versions/9/infer", {"inputs": [INPUT]}, 404, "Specific(mlp, 9)"),
    ("/v2/models/mlp/versions/latest/infer", {"inputs": [INPUT]}, 400, "not a whole number"),
    ("/v2/models/mlp/infer", b"{not json", 400, "JSON"),
    ("/v2/models/mlp/infer", {"inputs": [INPUT]}, None, None),  # the good one, between bad ones
    ("/v2/models/mlp/infer", {"inputs": [{**INPUT, "shape": [1, 15], "data": [1.0] * 15}]}, 400, "shape"),
    ("/v2/models/mlp/infer", {"inputs": [{**INPUT, "datatype": "FP64"}]}, 400, "expects float32"),
    ("/v2/models/mlp/infer", {"inputs": [{**INPUT, "datatype": "FLOAT"}]}, 400, "unknown datatype 'FLOAT'"),
    ("/v2/models/mlp/infer", {"inputs": [{**INPUT, "shape": [2, 16]}]}, 400, "holds 32 values, its data 16"),
    ("/v2/models/mlp/infer", {"inputs": [{**INPUT, "data": ["a"] * 16}]}, 400, "JSON values of type string"),
    ("/v2/models/mlp/infer", {"inputs": [{**INPUT, "name": "x"}]}, 400, "input tensor alias not found"),
    ("/v2/models/pair/infer", {"inputs": [{**INPUT, "name": "a", "shape": [1, 8], "data": [1.0] * 8}],
                               "parameters": {"signature_name": "pair"}}, 400, "missing input(s) b"),
    ("/v2/models/mlp/infer", {"inputs": [INPUT, INPUT]}, 400, "given twice"),
    ("/v2/models/mlp/infer", {"inputs": []}, 400, "'inputs' must list"),
    ("/v2/models/mlp/infer", {"inputs": [{k: v for k, v in INPUT.items() if k != "data"}]}, 400, "no values"),
    ("/v2/models/mlp/infer", {"inputs": [INPUT], "outputs": [{"name": "probs"}]}, 400,
     "output tensor alias not found"),
    ("/v2/models/mlp/infer", {"inputs": [INPUT], "parameters": {"signature_name": "nope"}}, 400, '"nope" not found'),
    ("/v2/models/mlp/infer", {"inputs": [{**INPUT, "parameters": {"binary_data_size": 64}}]}, 400, "does not fit"),
    ("/v2/models/mlp/infer", {"inputs": [INPUT], "id": 7}, 400, "'id' must be a string, got 7"),
    ("/v2/models/nope", None, 404, "nope"),
    ("/v2/models/pair", None, 400, 'signature name: "serving_default" not found'),  # pair serves `pair` only
    ("/v2/models/mlp/versions/7", None, 404, "Specific(mlp, 7)"),
    ("/v2/models/mlp/statistics", None, 404, "no Open Inference Protocol endpoint GET /v2/models/mlp/statistics"),
])
def test_bad_requests_get_an_error_and_the_server_serves_on(server, models, path, body, code, message):
    raw = body if isinstance(body, bytes) else None
    status, answer = server.rest.json(path, None if raw else body, raw)
    if code is None:
        assert status == 200 and answer["outputs"][0]["shape"] == [1, 10]
    else:
        assert status == code and set(answer) == {"error"} and message in answer["error"]
    x = random_array((1, 16))
    status, answer = server.rest.json("/v2/models/mlp/infer", {"inputs": [{**INPUT, "data": x.tolist()}]})
    assert status == 200
    logits = next(o for o in answer["outputs"] if o["name"] == "logits")
    np.testing.assert_allclose(np.reshape(logits["data"], (1, 10)), reference(models, "mlp", 2, features=x)["logits"],
                               **TOL)


def test_binary_data_follows_its_json_header(server, models):
    x = random_array((2, 16))
    header = json.dumps({"inputs": [{"name": "features", "shape": [2, 16], "datatype": "FP32",
                                     "parameters": {"binary_data_size": x.nbytes}}],
                         "outputs": [{"name": "scores", "parameters": {"binary_data": True}}]}).encode()
    length = {"Inference-Header-Content-Length": str(len(header))}
    status, body = server.rest.call("/v2/models/mlp/infer", raw=header + x.tobytes(), headers=length)
    assert status == 200
    answer = json.loads(body[:-x.shape[0] * 10 * 4])
    assert answer["outputs"] == [{"name": "scores", "datatype": "FP32", "shape": [2, 10],
                                  "parameters": {"binary_data_size": 80}}]
    np.testing.assert_allclose(np.frombuffer(body[-80:], np.float32).reshape(2, 10),
                               reference(models, "mlp", 2, features=x)["scores"], **TOL)
    status, answer = server.rest.json("/v2/models/mlp/infer", raw=header + x.tobytes() + b"\0", headers=length)
    assert status == 400 and "1 bytes after its JSON header" in answer["error"]
    status, answer = server.rest.json("/v2/models/mlp/infer", raw=header + x.tobytes(),
                                      headers={"Inference-Header-Content-Length": "-3"})
    assert status == 400 and "Inference-Header-Content-Length must be the byte length" in answer["error"]
    status, answer = server.rest.json("/v2/models/mlp/infer", raw=header, headers={"Content-Encoding": "br"})
    assert status == 400 and "Content-Encoding 'br' is not accepted" in answer["error"]


def test_tritonclient_raises_the_error_with_its_status(client):
    with pytest.raises(InferenceServerException) as info:
        client.infer("mlp", [infer_input("features", random_array((1, 12)))])
    assert info.value.status() == "400" and "expects shape float32[?,16], got [1, 12]" in info.value.message()
    with pytest.raises(InferenceServerException) as info:
        client.get_model_metadata("nope")
    assert info.value.status() == "404"


def test_requests_are_counted_by_outcome(client, server):
    client.infer("mlp", [infer_input("features", random_array((1, 16)))])
    with pytest.raises(InferenceServerException):
        client.infer("mlp", [infer_input("features", random_array((1, 16), "float64"))])
    client.get_model_metadata("mlp")
    assert_counted_by_outcome(server, "kserve_rest")


def test_concurrent_infers_merge_into_batches(batching_server, models):
    feeds = [random_array((n, 32, 32, 3)) for n in (1, 2, 1, 3, 1, 2)]
    before = batching_server.rest.call("/monitoring/prometheus/metrics")[1].decode()
    with _client(batching_server, concurrency=len(feeds)) as client:
        calls = [client.async_infer("cnn", [infer_input("image", x)]) for x in feeds]
        answers = [call.get_result() for call in calls]
    assert_batched(models, batching_server, feeds, answers, before)


def _infer_body(x):
    header = json.dumps({"inputs": [{"name": "features", "shape": list(x.shape), "datatype": "FP32",
                                     "parameters": {"binary_data_size": x.nbytes}}]}).encode()
    return header + x.tobytes(), str(len(header))


@pytest.mark.parametrize("encoding, compress", [("gzip", gzip.compress), ("deflate", zlib.compress)])
def test_a_compressed_body_decompresses_within_a_bound_and_whole(monkeypatch, encoding, compress):
    """A small compressed body can expand to gigabytes: past MAX_DECODED_BYTES it is refused, as is a truncated
    stream; within it, the request reads as the uncompressed one."""
    x = random_array((2, 16))
    body, header_length = _infer_body(x)
    parsed = kserve_rest.parse_infer(compress(body), header_length, encoding)
    np.testing.assert_array_equal(parsed.inputs["features"], x)
    monkeypatch.setattr(kserve_rest, "MAX_DECODED_BYTES", len(body) - 1)
    with pytest.raises(ServingError, match="decompresses to more than"):
        kserve_rest.parse_infer(compress(body), header_length, encoding)
    monkeypatch.setattr(kserve_rest, "MAX_DECODED_BYTES", 1 << 30)
    with pytest.raises(ServingError, match=f"not valid {encoding} data"):
        kserve_rest.parse_infer(compress(body)[:-8], header_length, encoding)
