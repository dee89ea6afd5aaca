"""serve_load.py's C load generator (benchmarks/loadgen/loadgen.c) against the in-process server: over each API
every request is answered; requests the server refuses count as errors of their kind (HTTP status, gRPC status)."""
import shutil

import numpy as np
import pytest

from benchmarks import serve_load

pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="the C load generator needs a C compiler (cc)")

API_PORTS = {"rest": "rest_port", "kserve-rest": "rest_port", "grpc": "grpc_port", "kserve-grpc": "grpc_port"}


def run(server, api, model="cnn", input_name="image", requests=50, connections=4):
    x = np.random.default_rng(0).standard_normal((1, 32, 32, 3), np.float32)
    request = serve_load.REQUESTS[api](model, input_name, x)
    return serve_load.c_clients(getattr(server.server, API_PORTS[api]), request, connections, requests, 30)


@pytest.mark.parametrize("api", sorted(API_PORTS))
def test_every_request_is_answered(server, api):
    result = run(server, api)
    assert (result["requests"], result["errors"], result["first_error"]) == (50, 0, None)
    assert 0 < result["p50_ms"] <= result["p99_ms"] and result["seconds"] > 0 and result["client_cpu_s"] >= 0


@pytest.mark.parametrize("api, model, input_name, kind", [
    ("rest", "nope", "image", "http_404"),
    ("rest", "cnn", "x", "http_400"),
    ("kserve-rest", "nope", "image", "http_404"),
    ("grpc", "nope", "image", "grpc_NOT_FOUND"),
    ("grpc", "cnn", "x", "grpc_INVALID_ARGUMENT"),
    ("kserve-grpc", "nope", "image", "grpc_NOT_FOUND"),
])
def test_refused_requests_count_as_errors_of_their_kind(server, api, model, input_name, kind):
    result = run(server, api, model, input_name, requests=6, connections=2)
    assert (result["requests"], result["errors"], result["error_kinds"]) == (0, 6, {kind: 6})
    assert result["first_error"].startswith(f"{kind}: ") and result["p50_ms"] is None


def test_a_closed_port_counts_as_connect_errors():
    port = serve_load._free_port()
    result = serve_load.c_clients(port, serve_load.REQUESTS["grpc"]("cnn", "image", np.zeros((1, 2), np.float32)),
                                  2, 4, 10)
    assert (result["requests"], result["error_kinds"]) == (0, {"connect": 4})


@pytest.mark.parametrize("api", sorted(API_PORTS))
def test_600_kb_requests_cross_many_flow_control_windows(server, api):
    x = np.random.default_rng(0).standard_normal((9600, 16), np.float32)  # ResNet-50's request size
    request = serve_load.REQUESTS[api]("mlp", "features", x)
    result = serve_load.c_clients(getattr(server.server, API_PORTS[api]), request, 2, 6, 30)
    assert (result["requests"], result["errors"], result["first_error"]) == (6, 0, None)


@pytest.mark.parametrize("api", ["grpc", "rest"])
def test_several_processes_share_the_connections_and_requests(server, api):
    x = np.random.default_rng(0).standard_normal((1, 32, 32, 3), np.float32)
    request = serve_load.REQUESTS[api]("cnn", "image", x)
    result = serve_load.c_clients(getattr(server.server, API_PORTS[api]), request, 5, 50, 30, procs=3)
    assert (result["requests"], result["errors"], result["first_error"]) == (50, 0, None)
    assert 0 < result["p50_ms"] <= result["p99_ms"] and result["seconds"] > 0


def test_errors_of_several_processes_add_up():
    port = serve_load._free_port()
    result = serve_load.c_clients(port, serve_load.REQUESTS["grpc"]("cnn", "image", np.zeros((1, 2), np.float32)),
                                  4, 8, 10, procs=2)
    assert (result["requests"], result["errors"], result["error_kinds"]) == (0, 8, {"connect": 8})
    assert result["first_error"].startswith("connect: ") and result["p99_ms"] is None
