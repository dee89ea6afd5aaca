"""tftrt-serve on Ray Serve: build_app's arguments become deployment options (resources, replicas or
autoscaling, batching); on a local Ray cluster (loopback, 2 CPUs) the converted CNN answers TF Serving's REST API
through Ray's proxy, row and columnar, as native TF computes it, with our scheduler and with Ray's @serve.batch
merging concurrent requests."""
import concurrent.futures
import os
import re
import socket
import types

import numpy as np
import pydantic
import pytest
import ray
from ray import serve

from conftest import Rest, metric, reference
from support import random_array
from tftrt_py.serving.config import BatchingOptions
from tftrt_py.serving.ray_app import RayAppArgs, build_app

TOL = dict(rtol=1e-5, atol=1e-5)
BATCHING = dict(max_batch_size=8, batch_timeout_micros=50_000, num_batch_threads=1, allowed_batch_sizes=[4, 8])
PREFIXES = {"tftrt": "/ours", "ray": "/ray"}  # one application per batching setting


def test_fixed_replicas_on_cpu_cores():
    options = RayAppArgs(model_base_path="/m", num_cpus=4, min_replicas=2, max_replicas=2).deployment_options(0)
    assert options == {"ray_actor_options": {"num_cpus": 4}, "max_ongoing_requests": 64, "num_replicas": 2,
                       "logging_config": {"enable_access_log": False}}


def test_access_log_is_off_unless_asked_for():
    assert RayAppArgs(model_base_path="/m").deployment_options(0)["logging_config"] == {"enable_access_log": False}
    args = RayAppArgs.model_validate({"model_base_path": "/m", "access_log": "true"})  # `serve run` k=v
    assert args.deployment_options(0)["logging_config"] == {"enable_access_log": True}


def test_autoscaling_one_gpu_per_replica():
    args = RayAppArgs.model_validate({"model_base_path": "/m", "num_gpus": "1", "min_replicas": "1",
                                      "max_replicas": "4", "target_ongoing_requests": "16"})  # `serve run` k=v
    options = args.deployment_options(args.replica_gpus())
    assert options["ray_actor_options"] == {"num_cpus": 1, "num_gpus": 1}
    assert options["autoscaling_config"] == {"min_replicas": 1, "max_replicas": 4, "target_ongoing_requests": 16}
    assert "num_replicas" not in options


def test_batching_parameters_file_with_overrides(tmp_path):
    path = tmp_path / "batching.config"
    path.write_text("max_batch_size { value: 32 } batch_timeout_micros { value: 2000 } num_batch_threads { value: 2 }"
                    " allowed_batch_sizes: 16 allowed_batch_sizes: 32")
    args = RayAppArgs(model_base_path="/m", batching="ray", batching_parameters_file=str(path),
                      batch_timeout_micros=500)
    assert args.batching_options() == BatchingOptions(max_batch_size=32, batch_timeout_micros=500,
                                                      num_batch_threads=2, allowed_batch_sizes=(16, 32))
    assert RayAppArgs(model_base_path="/m", max_batch_size=8).batching_options() is None  # batching off


@pytest.mark.parametrize("args, error", [
    ({"model_base_path": "/m", "batching": "yes"}, "batching"),
    ({"model_base_path": "/m", "max_batch": 8}, "max_batch"),  # a misspelt argument is refused, not ignored
    ({"model_base_path": "/m", "min_replicas": 3, "max_replicas": 2}, "max_replicas"),
    ({}, "model_base_path"),
])
def test_bad_arguments_are_refused(args, error):
    with pytest.raises((pydantic.ValidationError, ValueError), match=error):
        build_app(args)


def _free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def cluster(models):
    """A local Ray cluster serving the converted CNN twice: batching by our scheduler and by Ray's."""
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"TFTRT_PY_BACKEND": os.environ["TFTRT_PY_BACKEND"]}})
    try:
        port = _free_port()
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        serve.run_many([serve.RunTarget(build_app({"model_name": "cnn", "model_base_path": os.path.join(
            models.root, "cnn"), "batching": batching, **BATCHING}), name=batching, route_prefix=prefix)
            for batching, prefix in PREFIXES.items()])
        yield types.SimpleNamespace(port=port)
    finally:
        serve.shutdown()
        ray.shutdown()


@pytest.mark.parametrize("batching", PREFIXES)
def test_row_and_columnar_predict(cluster, models, batching):
    rest = Rest(cluster.port, PREFIXES[batching])
    x = random_array((3, 32, 32, 3))
    (want,) = reference(models, "cnn", 1, image=x).values()
    status, body = rest.json("/v1/models/cnn:predict", {"instances": x.tolist()})
    assert status == 200
    np.testing.assert_allclose(np.array(body["predictions"]), want, **TOL)
    status, body = rest.json("/v1/models/cnn/versions/1:predict", {"inputs": {"image": x.tolist()}})
    assert status == 200
    np.testing.assert_allclose(np.array(body["outputs"]), want, **TOL)
    status, body = rest.json("/v1/models/cnn")
    assert status == 200 and body["model_version_status"][0]["state"] == "AVAILABLE"


@pytest.mark.parametrize("batching", PREFIXES)
def test_concurrent_requests_merge_and_split_back(cluster, models, batching):
    rest = Rest(cluster.port, PREFIXES[batching])
    feeds = [random_array((n, 32, 32, 3)) for n in (1, 2, 1, 3, 1, 2, 1, 1, 2, 3)]
    before = rest.call("/monitoring/prometheus/metrics")[1].decode()
    with concurrent.futures.ThreadPoolExecutor(len(feeds)) as pool:
        answers = list(pool.map(lambda x: rest.json("/v1/models/cnn:predict", {"instances": x.tolist()}), feeds))
    for x, (status, body) in zip(feeds, answers):
        assert status == 200
        (want,) = reference(models, "cnn", 1, image=x).values()
        np.testing.assert_allclose(np.array(body["predictions"]), want, **TOL)
    after = rest.call("/monitoring/prometheus/metrics")[1].decode()

    def grown(name):
        return metric(after, name, model="cnn") - metric(before, name, model="cnn")

    assert grown("tftrt_serving_batch_size_sum") == sum(len(x) for x in feeds)
    assert grown("tftrt_serving_batch_size_count") < len(feeds)  # requests merged
    fallbacks = [float(v) for v in re.findall(r"^tftrt_engine_op_fallback_total\{[^}]*\} (\S+)", after, re.M)]
    assert fallbacks and sum(fallbacks) == 0  # padded batches (4, 8) ran on the engines built for them


def test_ray_batching_refuses_a_request_over_max_batch_size(cluster):
    status, body = Rest(cluster.port, PREFIXES["ray"]).json("/v1/models/cnn:predict",
                                                            {"inputs": random_array((9, 32, 32, 3)).tolist()})
    assert status == 400 and "larger than maximum input batch size 8" in body["error"]
