"""Converted models in TF Serving's layout (<root>/<model>/<version>/), the native models they came from, and
servers (REST and gRPC on ephemeral loopback ports) with batching off and on; a plain model of string, int64 and
bool tensors on a server of its own."""
import json
import os
import re
import types
import urllib.error
import urllib.request

import numpy as np
import pytest
import tensorflow as tf

from sample_models import save_model
from support import random_array
from tftrt_py import trt_convert as trt
from tftrt_py.serving import BatchingOptions, ModelSpec, Server, VersionPolicy


class Pair(tf.Module):
    """Two signatures: `pair` (inputs a [?,8], b [?,8]; outputs total, gated) and `serving_default`."""

    def __init__(self):
        rng = np.random.default_rng(7)
        self.w = tf.Variable(rng.normal(0, 0.4, (8, 6)).astype("float32"))
        self.v = tf.Variable(rng.normal(0, 0.4, (8, 6)).astype("float32"))

    @tf.function(input_signature=[tf.TensorSpec([None, 8], tf.float32, name="a"),
                                  tf.TensorSpec([None, 8], tf.float32, name="b")])
    def pair(self, a, b):
        total = tf.nn.relu(tf.matmul(a, self.w) + tf.matmul(b, self.v))
        return {"total": total, "gated": tf.sigmoid(tf.matmul(a, self.w)) * total}

    @tf.function(input_signature=[tf.TensorSpec([None, 8], tf.float32, name="x")])
    def serve(self, x):
        return {"y": tf.nn.relu(tf.matmul(x, self.w))}


class Typed(tf.Module):
    """A signature of string, int64 and bool tensors (text [?], count [?,2], flag [?])."""

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="text"),
                                  tf.TensorSpec([None, 2], tf.int64, name="count"),
                                  tf.TensorSpec([None], tf.bool, name="flag")])
    def serve(self, text, count, flag):
        return {"upper": tf.strings.upper(text), "doubled": count * 2, "negated": tf.logical_not(flag)}


def _convert(native_dir, out_dir, feeds, signature="serving_default"):
    converter = trt.TrtGraphConverterV2(input_saved_model_dir=native_dir, input_saved_model_signature_key=signature)
    converter.convert()
    converter.build(input_fn=lambda: iter(feeds))
    converter.save(out_dir)
    return out_dir


@pytest.fixture(scope="session")
def models(tmp_path_factory, saved_model):
    """root: the converted models (mlp versions 1 and 2: different weights; cnn: engines for batches 4 and 8;
    pair: the `pair` signature only); native: {(model, version): native signatures by name}."""
    from sample_models import MLP

    root = tmp_path_factory.mktemp("served")
    work = tmp_path_factory.mktemp("native")
    native = {}
    for version, seed in ((1, 0), (2, 1)):
        module = MLP(seed)
        path = str(work / f"mlp{version}")
        tf.saved_model.save(module, path, signatures={"serving_default": module.serve})
        _convert(path, str(root / "mlp" / str(version)), [(random_array((4, 16)),)])
        native["mlp", version] = tf.saved_model.load(path).signatures
    cnn = save_model("small_cnn", str(work / "cnn"))
    _convert(cnn, str(root / "cnn" / "1"), [(random_array((b, 32, 32, 3)),) for b in (4, 8)])
    native["cnn", 1] = tf.saved_model.load(cnn).signatures
    pair = Pair()
    path = str(work / "pair")
    tf.saved_model.save(pair, path, signatures={"serving_default": pair.serve, "pair": pair.pair})
    _convert(path, str(root / "pair" / "1"), [(random_array((4, 8)), random_array((4, 8)))], signature="pair")
    native["pair", 1] = tf.saved_model.load(path).signatures
    return types.SimpleNamespace(root=str(root), native=native)


def specs(root, **policies):
    return [ModelSpec(name, os.path.join(root, name), policies.get(name, VersionPolicy()))
            for name in ("mlp", "cnn", "pair")]


def reference(models, model, version, signature="serving_default", **inputs):
    """Native TF's outputs as numpy arrays."""
    outputs = models.native[model, version][signature](**{k: tf.constant(v) for k, v in inputs.items()})
    return {k: v.numpy() for k, v in outputs.items()}


def metric(text, name, **labels):
    """The value of sample `name{labels}` in a Prometheus exposition `text` (0 when absent)."""
    pattern = re.escape(name) + r"\{" + ",".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + r"\} (\S+)"
    found = re.search(pattern, text)
    return float(found.group(1)) if found else 0.0


def assert_counted_by_outcome(server, api):
    """The metrics count `api`'s (kserve_rest, kserve_grpc) answered infer, refused infer and metadata calls on mlp."""
    text = server.rest.call("/monitoring/prometheus/metrics")[1].decode()
    for call, status in (("infer", "OK"), ("infer", "INVALID_ARGUMENT"), ("metadata", "OK")):
        assert metric(text, "tftrt_serving_requests_total", model="mlp", api=f"{api}_{call}", status=status) >= 1


def assert_batched(models, batching_server, feeds, answers, before):
    """`answers` (tritonclient results) are the cnn's for `feeds`, and their rows ran in fewer batches than
    requests since the metrics text `before`."""
    for x, answer in zip(feeds, answers):
        (name, want), = reference(models, "cnn", 1, image=x).items()
        np.testing.assert_allclose(answer.as_numpy(name), want, rtol=1e-5, atol=1e-5)
    after = batching_server.rest.call("/monitoring/prometheus/metrics")[1].decode()
    batches, rows = (metric(after, f"tftrt_serving_batch_size_{k}", model="cnn") -
                     metric(before, f"tftrt_serving_batch_size_{k}", model="cnn") for k in ("count", "sum"))
    assert rows == sum(len(x) for x in feeds) and batches < len(feeds)


class Rest:
    """A plain HTTP+JSON client, as TF Serving REST clients are: (status, parsed body)."""

    def __init__(self, port, prefix=""):
        self.base = f"http://127.0.0.1:{port}{prefix}"

    def call(self, path, body=None, raw=None, headers=None):
        data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
        request = urllib.request.Request(self.base + path, data=data, method="GET" if data is None else "POST",
                                         headers=headers or {})
        try:
            with urllib.request.urlopen(request, timeout=60) as response:
                return response.status, response.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()

    def json(self, path, body=None, raw=None, headers=None):
        status, text = self.call(path, body, raw, headers)
        return status, json.loads(text)


@pytest.fixture(scope="session")
def server(models):
    """Every model (mlp: all versions, latest served by default), batching off."""
    with Server(specs(models.root, mlp=VersionPolicy("all"))) as running:
        yield types.SimpleNamespace(server=running, rest=Rest(running.rest_port))


@pytest.fixture(scope="session")
def batching_server(models):
    """The same models, batching on: batches of up to 8 rows padded to 4 or 8, 50 ms timeout."""
    options = BatchingOptions(max_batch_size=8, batch_timeout_micros=50_000, num_batch_threads=2,
                              allowed_batch_sizes=(4, 8))
    with Server(specs(models.root), batching=options) as running:
        yield types.SimpleNamespace(server=running, rest=Rest(running.rest_port))


@pytest.fixture(scope="session")
def typed_server(tmp_path_factory):
    """`typed` alone, as saved (no engines: nothing in it converts), batching off."""
    root = tmp_path_factory.mktemp("typed")
    module = Typed()
    tf.saved_model.save(module, str(root / "typed" / "1"), signatures={"serving_default": module.serve})
    with Server([ModelSpec("typed", str(root / "typed"))]) as running:
        yield types.SimpleNamespace(server=running, rest=Rest(running.rest_port))
