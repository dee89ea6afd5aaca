"""TF Serving's REST API: predict (row and columnar, named signatures, versions and labels), status, metadata,
errors as {"error": ...} with TF Serving's HTTP codes (the server serving on after each), health and metrics."""
import json

import numpy as np
import pytest

from conftest import reference
from support import random_array
from tftrt_py.serving import json_http

TOL = dict(rtol=1e-5, atol=1e-5)


def test_row_format_predict_matches_native_tf(server, models):
    x = random_array((3, 16))
    status, body = server.rest.json("/v1/models/mlp:predict", {"instances": x.tolist()})
    assert status == 200
    want = reference(models, "mlp", 2, features=x)  # the latest version by default
    assert len(body["predictions"]) == 3 and set(body["predictions"][0]) == {"logits", "scores"}
    for name in want:
        np.testing.assert_allclose(np.array([row[name] for row in body["predictions"]]), want[name], **TOL)


def test_columnar_predict_of_a_cnn_matches_native_tf(server, models):
    x = random_array((4, 32, 32, 3))
    status, body = server.rest.json("/v1/models/cnn:predict", {"inputs": {"image": x.tolist()}})
    assert status == 200
    (name, want), = reference(models, "cnn", 1, image=x).items()
    np.testing.assert_allclose(np.array(body["outputs"]), want, **TOL)  # a single output: its value


def test_named_signature_with_two_inputs(server, models):
    a, b = random_array((2, 8)), random_array((2, 8))
    want = reference(models, "pair", 1, "pair", a=a, b=b)
    rows = [{"a": a[i].tolist(), "b": b[i].tolist()} for i in range(2)]
    status, body = server.rest.json("/v1/models/pair:predict", {"signature_name": "pair", "instances": rows})
    assert status == 200
    for name in want:
        np.testing.assert_allclose(np.array([row[name] for row in body["predictions"]]), want[name], **TOL)
    status, body = server.rest.json("/v1/models/pair:predict",
                                    {"signature_name": "pair", "inputs": {"a": a.tolist(), "b": b.tolist()}})
    assert status == 200
    for name in want:
        np.testing.assert_allclose(np.array(body["outputs"][name]), want[name], **TOL)


def test_specific_versions(server, models):
    x = random_array((2, 16))
    for version in (1, 2):
        status, body = server.rest.json(f"/v1/models/mlp/versions/{version}:predict", {"inputs": x.tolist()})
        assert status == 200
        want = reference(models, "mlp", version, features=x)
        np.testing.assert_allclose(np.array(body["outputs"]["logits"]), want["logits"], **TOL)
    assert not np.allclose(reference(models, "mlp", 1, features=x)["logits"],
                           reference(models, "mlp", 2, features=x)["logits"], atol=1e-3)


def test_status(server):
    ok = {"error_code": "OK", "error_message": ""}
    assert server.rest.json("/v1/models/mlp") == (200, {"model_version_status": [
        {"version": "1", "state": "AVAILABLE", "status": ok}, {"version": "2", "state": "AVAILABLE", "status": ok}]})
    assert server.rest.json("/v1/models/mlp/versions/1") == (200, {"model_version_status": [
        {"version": "1", "state": "AVAILABLE", "status": ok}]})
    assert server.rest.json("/v1/models/cnn")[1]["model_version_status"][0]["version"] == "1"


def test_metadata_gives_the_signature_defs(server):
    status, body = server.rest.json("/v1/models/pair/metadata")
    assert status == 200
    assert body["model_spec"] == {"name": "pair", "signature_name": "", "version": "1"}
    signature = body["metadata"]["signature_def"]["signature_def"]["pair"]
    assert set(signature["inputs"]) == {"a", "b"} and set(signature["outputs"]) == {"gated", "total"}
    assert signature["inputs"]["a"]["dtype"] == "DT_FLOAT"
    assert [d["size"] for d in signature["inputs"]["a"]["tensor_shape"]["dim"]] == ["-1", "8"]
    assert server.rest.json("/v1/models/mlp/versions/1/metadata")[1]["model_spec"]["version"] == "1"


@pytest.mark.parametrize("path, body, code, message", [
    ("/v1/models/nope:predict", {"instances": [[1.0]]}, 404, "Servable not found for request: Latest(nope)"),
    ("/v1/models/mlp/versions/9:predict", {"instances": [[1.0]]}, 404, "Specific(mlp, 9)"),
    ("/v1/models/mlp/labels/stable:predict", {"instances": [[1.0]]}, 400, "label"),
    ("/v1/models/mlp:predict", b"{not json", 400, "JSON"),
    ("/v1/models/mlp:predict", {"instances": [[1.0] * 16]}, None, None),  # the good one, between bad ones
    ("/v1/models/mlp:predict", {"inputs": {"feature": [[1.0] * 16]}}, 400, "input tensor alias not found"),
    ("/v1/models/mlp:predict", {"instances": [[1.0] * 15]}, 400, "shape"),
    ("/v1/models/mlp:predict", {"instances": [[1.0] * 16, [1.0] * 15]}, 400, "rectangular"),
    ("/v1/models/mlp:predict", {"instances": [["a"] * 16]}, 400, "float32"),
    ("/v1/models/mlp:predict", {"instances": [[1.0] * 16], "inputs": [[1.0] * 16]}, 400, "exactly one"),
    ("/v1/models/mlp:predict", {"instances": []}, 400, "non-empty"),
    ("/v1/models/mlp:predict", [1, 2], 400, "JSON object"),
    ("/v1/models/mlp:predict", {"signature_name": "nope", "instances": [[1.0] * 16]}, 400, '"nope" not found'),
    ("/v1/models/pair:predict", {"signature_name": "pair", "instances": [[1.0] * 8]}, 400, "object keyed"),
    ("/v1/models/mlp:classify", {"instances": [[1.0] * 16]}, 501, "only predict"),
    ("/v1/models/nope", None, 404, "nope"),
    ("/v1/models/mlp/versions/7", None, 404, "version 7"),
    ("/v1/models/nope/metadata", None, 404, "nope"),
])
def test_bad_requests_get_tf_serving_errors_and_the_server_serves_on(server, models, path, body, code, message):
    raw = body if isinstance(body, bytes) else None
    status, answer = server.rest.json(path, None if raw else body, raw)
    if code is None:
        assert status == 200 and len(answer["predictions"]) == 1
    else:
        assert status == code and set(answer) == {"error"} and message in answer["error"]
    x = random_array((1, 16))
    status, answer = server.rest.json("/v1/models/mlp:predict", {"inputs": x.tolist()})
    assert status == 200
    np.testing.assert_allclose(answer["outputs"]["logits"], reference(models, "mlp", 2, features=x)["logits"], **TOL)


def test_an_int_input_takes_no_floats(server):
    status, answer = server.rest.json("/v1/models/mlp:predict", {"instances": [[1] * 16]})  # ints -> float: fine
    assert status == 200
    assert server.rest.call("/v1/models/mlp:predict", raw=json.dumps({"instances": [[None] * 16]}).encode())[0] == 400


def test_health_readiness_and_metrics(server):
    assert server.rest.call("/healthz") == (200, b"ok")
    assert server.rest.call("/readyz") == (200, b"ready")
    server.rest.json("/v1/models/cnn:predict", {"instances": random_array((2, 32, 32, 3)).tolist()})
    server.rest.json("/v1/models/cnn:predict", {"instances": [[1.0]]})
    status, text = server.rest.call("/monitoring/prometheus/metrics")
    text = text.decode()
    assert status == 200
    assert 'tftrt_serving_requests_total{api="rest_predict",model="cnn",status="OK"}' in text
    assert 'tftrt_serving_requests_total{api="rest_predict",model="cnn",status="INVALID_ARGUMENT"}' in text
    assert 'tftrt_serving_request_latency_seconds_count{api="rest_predict",model="cnn"}' in text
    assert "tftrt_engine_op_fallback_total{engine_op=" in text and "tftrt_engine_op_engine_runs_total" in text
    assert "tftrt_serving_batch_size" in text
    runs = [float(line.split()[-1]) for line in text.splitlines() if line.startswith("tftrt_engine_op_engine_runs")]
    assert sum(runs) >= 1  # the engines served


@pytest.mark.parametrize("chunked", [False, True])
@pytest.mark.parametrize("path", ["/v1/models/mlp:predict", "/v2/models/mlp/infer"])
def test_a_body_larger_than_served_is_refused_and_the_server_goes_on(server, monkeypatch, path, chunked):
    """TF Serving's and KServe's REST bodies are held to gRPC's message limit (json_http.MAX_BODY_BYTES): past it,
    RESOURCE_EXHAUSTED (429) with what to do, before the body is read whole (by its Content-Length, or as its
    chunks arrive)."""
    body = json.dumps({"instances": [[0.5] * 16]}).encode()
    monkeypatch.setattr(json_http, "MAX_BODY_BYTES", len(body) - 1)
    status, answer = server.rest.json(path, raw=iter([body[:10], body[10:]]) if chunked else body)
    assert status == 429 and "send less per request" in answer["error"]
    monkeypatch.undo()
    assert server.rest.call("/v1/models/mlp:predict", raw=body)[0] == 200
