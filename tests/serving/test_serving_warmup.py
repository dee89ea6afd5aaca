"""TF Serving's SavedModel warm-up: a version's assets.extra/tf_serving_warmup_requests (a TFRecord of
PredictionLogs) is replayed on its signatures before the version is AVAILABLE, each predict request
--num_request_iterations_for_warmup times, and the load waits for the engine builds those calls started; other log
kinds are skipped; a failing, malformed or oversized warm-up file fails the version's load as in TF Serving, and
warm-up off (0 iterations) never reads it."""
import os
import re
import shutil

import numpy as np
import pytest
import tensorflow as tf
from tensorflow_serving.apis import classification_pb2, predict_pb2, prediction_log_pb2

from support import random_array
from tftrt_py.engine_op import dispatcher
from tftrt_py.serving import ModelSpec
from tftrt_py.serving.cli import build_parser, server_from_args
from tftrt_py.serving.models import ModelManager, Signature
from tftrt_py.serving.warmup import MAX_RECORDS, WARMUP_PATH, warmer


def predict_log(inputs, signature=""):
    request = predict_pb2.PredictRequest()
    request.model_spec.name = "mlp"
    request.model_spec.signature_name = signature
    for name, array in inputs.items():
        request.inputs[name].CopyFrom(tf.make_tensor_proto(array))
    return prediction_log_pb2.PredictionLog(predict_log=prediction_log_pb2.PredictLog(request=request))


def classify_log():
    request = classification_pb2.ClassificationRequest()
    request.model_spec.name = "mlp"
    return prediction_log_pb2.PredictionLog(classify_log=prediction_log_pb2.ClassifyLog(request=request))


def write_records(version_dir, records):
    path = os.path.join(version_dir, WARMUP_PATH)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with tf.io.TFRecordWriter(path) as writer:
        for record in records:
            writer.write(record if isinstance(record, bytes) else record.SerializeToString())


@pytest.fixture
def mlp(models, tmp_path):
    """A copy of the converted mlp's version 1 under <tmp>/mlp/1: (base path, version folder)."""
    base = tmp_path / "mlp"
    shutil.copytree(os.path.join(models.root, "mlp", "1"), base / "1")
    return str(base), str(base / "1")


@pytest.fixture
def runs(monkeypatch):
    """The batches the signatures ran, as (signature, rows), and the engine-build waits, in order."""
    calls = []
    run = Signature.run

    def counted(self, arrays):
        calls.append((self.name, len(next(iter(arrays.values())))))
        return run(self, arrays)

    monkeypatch.setattr(Signature, "run", counted)
    original = dispatcher.wait_for_builds
    monkeypatch.setattr(dispatcher, "wait_for_builds",
                        lambda timeout=None: (calls.append("waited"), original(timeout)))
    return calls


def status(manager, version=1):
    return manager.status("mlp", version)[0]


def test_predict_requests_replay_before_the_version_is_available(mlp, runs, caplog):
    base, version = mlp
    write_records(version, [predict_log({"features": random_array((1, 16))}), classify_log(),
                            predict_log({"features": random_array((3, 16))}, "serving_default")])
    manager = ModelManager([ModelSpec("mlp", base)], warmer(2))
    manager.load()
    assert status(manager).state == "AVAILABLE"
    assert runs == [("serving_default", 1), ("serving_default", 1), ("serving_default", 3), ("serving_default", 3),
                    "waited"]
    assert "1 warm-up record(s) skipped: only predict logs" in caplog.text


def test_the_served_answers_are_the_models_after_warm_up(mlp, models):
    base, version = mlp
    write_records(version, [predict_log({"features": random_array((2, 16))})])
    manager = ModelManager([ModelSpec("mlp", base)], warmer(1))
    manager.load()
    x = random_array((5, 16))
    got = manager.servable("mlp").signature("serving_default").run({"features": x})
    want = models.native["mlp", 1]["serving_default"](features=tf.constant(x))
    np.testing.assert_allclose(got["logits"], want["logits"].numpy(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("records, error", [
    ([predict_log({"nope": random_array((1, 16))})], "warm-up request 0 of .* failed: .*nope"),
    ([predict_log({"features": random_array((1, 16))}), predict_log({"features": random_array((1, 7))})],
     "warm-up request 1 of .* failed"),
    ([predict_log({"features": random_array((1, 16))}, "no_such_signature")], "warm-up request 0 of .* failed"),
    ([b"\x0a\xff\xff"], "warm-up record 0 of .* is not a PredictionLog"),
])
def test_a_failing_or_malformed_warm_up_request_fails_the_load(mlp, records, error):
    base, version = mlp
    write_records(version, records)
    manager = ModelManager([ModelSpec("mlp", base)], warmer(1))
    with pytest.raises(ValueError, match="no version loaded"):
        manager.load()
    assert status(manager).state == "END"
    assert re.search(error, status(manager).error)


def test_more_than_a_thousand_records_are_refused(mlp):
    base, version = mlp
    log = predict_log({"features": random_array((1, 16))})
    write_records(version, [log] * (MAX_RECORDS + 1))
    manager = ModelManager([ModelSpec("mlp", base)], warmer(1))
    with pytest.raises(ValueError):
        manager.load()
    assert f"more than {MAX_RECORDS} warm-up records" in status(manager).error


def test_a_truncated_file_fails_the_load(mlp):
    base, version = mlp
    write_records(version, [predict_log({"features": random_array((1, 16))})])
    path = os.path.join(version, WARMUP_PATH)
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) - 3)
    manager = ModelManager([ModelSpec("mlp", base)], warmer(1))
    with pytest.raises(ValueError):
        manager.load()
    assert "is not a readable TFRecord file" in status(manager).error


def test_warm_up_off_never_reads_the_file(mlp, runs):
    base, version = mlp
    write_records(version, [b"not a record file"])
    assert warmer(0) is None
    manager = ModelManager([ModelSpec("mlp", base)], warmer(0))
    manager.load()
    assert status(manager).state == "AVAILABLE" and runs == []


def test_a_version_without_a_warm_up_file_loads_as_before(mlp, runs):
    base, _ = mlp
    manager = ModelManager([ModelSpec("mlp", base)], warmer(1))
    manager.load()
    assert status(manager).state == "AVAILABLE" and runs == []


@pytest.mark.parametrize("flags, iterations", [
    ([], 1), (["--num_request_iterations_for_warmup=3"], 3), (["--enable_model_warmup=false"], 0),
    (["--enable_model_warmup=false", "--num_request_iterations_for_warmup=3"], 0),
])
def test_tf_serving_flags_set_the_iterations(flags, iterations):
    args = build_parser().parse_args(["--model_base_path=/m", *flags])
    assert server_from_args(args).warmup_iterations == iterations


def test_a_negative_iteration_count_is_refused(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--model_base_path=/m", "--num_request_iterations_for_warmup=-1"])
    assert "num_request_iterations_for_warmup" in capsys.readouterr().err
