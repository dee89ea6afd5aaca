"""Front-end worker processes (Server(frontend_workers=N), --frontend_workers): N processes serve REST and gRPC
on the same ports and send the tensors to the model process through shared memory. Answers, errors, status,
metadata and readiness equal the single-process server's over TF Serving's REST and gRPC APIs and KServe v2's,
batching off and on; requests are counted once in the model process's metrics; a new version shows through the
workers; a killed worker is replaced while the others answer; stop() leaves no process and no shared memory."""
import concurrent.futures
import gc
import json
import os
import pickle
import shutil
import signal
import time
import types

import grpc
import ml_dtypes
import numpy as np
import pytest
import tensorflow as tf
from tensorflow_serving.apis import (get_model_metadata_pb2, get_model_status_pb2, model_service_pb2_grpc,
                                     predict_pb2, prediction_service_pb2_grpc)
from tensorflow.core.protobuf import meta_graph_pb2
from tritonclient.grpc import service_pb2, service_pb2_grpc

from conftest import Rest, Typed, metric, reference, specs
from support import random_array
from tftrt_py.serving import BatchingOptions, ModelSpec, Server, VersionPolicy
from tftrt_py.serving.cli import build_parser, server_from_args
from tftrt_py.serving.shared_tensors import Arena
from tftrt_py.serving.worker_link import decode
from tftrt_py.serving.worker_pool import WorkerPool

TOL = dict(rtol=1e-5, atol=1e-5)
BATCHING = BatchingOptions(max_batch_size=8, batch_timeout_micros=50_000, num_batch_threads=2,
                           allowed_batch_sizes=(4, 8))


def _running(server):
    return types.SimpleNamespace(server=server, rest=Rest(server.rest_port))


@pytest.fixture(scope="module")
def workers_server(models):
    """The conftest `server`'s models and settings (batching off), served by two front-end workers."""
    with Server(specs(models.root, mlp=VersionPolicy("all")), frontend_workers=2) as running:
        yield _running(running)


@pytest.fixture(scope="module")
def workers_batching_server(models):
    """The conftest `batching_server`'s models and batching, served by two front-end workers."""
    with Server(specs(models.root), batching=BATCHING, frontend_workers=2) as running:
        yield _running(running)


@pytest.fixture(params=["batching off", "batching on"])
def pair(request):
    """(single-process server, front-end workers server) of the same models and batching."""
    single, workers = ("server", "workers_server") if request.param == "batching off" else \
        ("batching_server", "workers_batching_server")
    return request.getfixturevalue(single), request.getfixturevalue(workers)


def _grpc(running, service, method, request):
    with grpc.insecure_channel(f"127.0.0.1:{running.server.grpc_port}") as channel:
        try:
            return getattr(service(channel), method)(request, timeout=60)
        except grpc.RpcError as exc:
            return exc.code(), exc.details()


def _predict(model, **inputs):
    request = predict_pb2.PredictRequest()
    request.model_spec.name = model
    for name, value in inputs.items():
        request.inputs[name].CopyFrom(tf.make_tensor_proto(value))
    return request


def _infer(model, name, array, version=""):
    request = service_pb2.ModelInferRequest(model_name=model, model_version=version)
    request.inputs.add(name=name, datatype={"float32": "FP32", "float64": "FP64"}[array.dtype.name],
                       shape=array.shape)
    request.raw_input_contents.append(array.tobytes())
    return request


def _kserve_json(name, array):
    return {"inputs": [{"name": name, "shape": list(array.shape), "datatype": "FP32",
                        "data": array.reshape(-1).tolist()}]}


PREDICT = prediction_service_pb2_grpc.PredictionServiceStub
KSERVE = service_pb2_grpc.GRPCInferenceServiceStub


def _listening_ports(pid):
    """The TCP ports process `pid` listens on (its sockets' inodes in /proc/net/tcp{,6}, state LISTEN)."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for line in f.readlines()[1:]:
                fields = line.split()
                if fields[3] == "0A" and fields[9] in inodes:
                    ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def test_every_worker_listens_on_both_ports_and_the_model_process_on_none(workers_server):
    server = workers_server.server
    for pid in server.workers.pids():
        assert {server.grpc_port, server.rest_port} <= _listening_ports(pid)
    assert not {server.grpc_port, server.rest_port} & _listening_ports(os.getpid())


def test_answers_equal_the_single_process_servers_and_native_tf(pair, models):
    single, workers = pair
    x = random_array((3, 32, 32, 3))
    (name, want), = reference(models, "cnn", 1, image=x).items()
    rest = [running.rest.json("/v1/models/cnn:predict", {"instances": x.tolist()}) for running in pair]
    assert rest[0] == rest[1] and rest[1][0] == 200
    np.testing.assert_allclose(rest[1][1]["predictions"], want, **TOL)
    answers = [_grpc(running, PREDICT, "Predict", _predict("cnn", image=x)) for running in pair]
    assert answers[0] == answers[1]
    np.testing.assert_allclose(tf.make_ndarray(answers[1].outputs[name]), want, **TOL)
    kserve_rest = [running.rest.json("/v2/models/cnn/infer", _kserve_json("image", x)) for running in pair]
    assert kserve_rest[0] == kserve_rest[1] and kserve_rest[1][0] == 200
    kserve_grpc = [_grpc(running, KSERVE, "ModelInfer", _infer("cnn", "image", x)) for running in pair]
    assert kserve_grpc[0] == kserve_grpc[1]
    np.testing.assert_allclose(np.frombuffer(kserve_grpc[1].raw_output_contents[0], np.float32).reshape(want.shape),
                               want, **TOL)


def test_two_inputs_a_named_signature_versions_and_an_output_filter(workers_server, server, models):
    a, b = random_array((2, 8)), random_array((2, 8))
    body = {"signature_name": "pair", "inputs": {"a": a.tolist(), "b": b.tolist()}}
    assert workers_server.rest.json("/v1/models/pair:predict", body) == server.rest.json("/v1/models/pair:predict",
                                                                                         body)
    x = random_array((2, 16))
    request = _predict("mlp", features=x)
    request.model_spec.version.value = 1
    request.output_filter.append("logits")
    answer = _grpc(workers_server, PREDICT, "Predict", request)
    assert answer == _grpc(server, PREDICT, "Predict", request) and list(answer.outputs) == ["logits"]
    np.testing.assert_allclose(tf.make_ndarray(answer.outputs["logits"]),
                               reference(models, "mlp", 1, features=x)["logits"], **TOL)


REST_ERRORS = [
    ("/v1/models/nope:predict", {"instances": [[1.0]]}),
    ("/v1/models/mlp/versions/9:predict", {"instances": [[1.0]]}),
    ("/v1/models/mlp/labels/stable:predict", {"instances": [[1.0]]}),
    ("/v1/models/mlp:predict", b"{not json"),
    ("/v1/models/mlp:predict", {"instances": [[1.0] * 15]}),
    ("/v1/models/mlp:predict", {"inputs": {"feature": [[1.0] * 16]}}),
    ("/v1/models/mlp:predict", {"signature_name": "nope", "instances": [[1.0] * 16]}),
    ("/v1/models/mlp:classify", {"instances": [[1.0] * 16]}),
    ("/v1/models/mlp/versions/7", None),
    ("/v2/models/nope/infer", _kserve_json("features", np.ones((1, 16), "float32"))),
    ("/v2/models/mlp/infer", _kserve_json("features", np.ones((1, 15), "float32"))),
    ("/v2/models/mlp/infer", {"inputs": [], "id": 7}),
    ("/v2/models/pair", None),
]


def test_bad_requests_get_the_single_process_servers_errors(pair):
    for path, body in REST_ERRORS:
        raw = body if isinstance(body, bytes) else None
        answers = [running.rest.call(path, None if raw else body, raw) for running in pair]
        assert answers[0] == answers[1] and answers[1][0] >= 400, path
    over = {"instances": [[1.0] * 16] * 9}  # refused with batching on (over max_batch_size), else answered
    assert pair[0].rest.call("/v1/models/mlp:predict", over) == pair[1].rest.call("/v1/models/mlp:predict", over)
    x64 = random_array((1, 16), "float64")
    for request in (_infer("mlp", "features", x64), _infer("mlp", "features", random_array((1, 16)), "v1"),
                    _infer("nope", "features", x64)):
        answers = [_grpc(running, KSERVE, "ModelInfer", request) for running in pair]
        assert answers[0] == answers[1] and isinstance(answers[1][0], grpc.StatusCode)
    for request in (_predict("mlp", features=x64), _predict("mlp", x=random_array((1, 16)))):
        answers = [_grpc(running, PREDICT, "Predict", request) for running in pair]
        assert answers[0] == answers[1] and answers[1][0] == grpc.StatusCode.INVALID_ARGUMENT


def test_status_metadata_and_readiness_equal_the_single_process_servers(workers_server, server):
    pair = (server, workers_server)
    for path in ("/v1/models/mlp", "/v1/models/mlp/versions/1", "/v1/models/cnn/metadata", "/v2",
                 "/v2/models/mlp", "/v2/models/mlp/versions/1/ready", "/v2/models/mlp/versions/3/ready",
                 "/v2/health/ready", "/readyz", "/healthz"):
        answers = [running.rest.call(path) for running in pair]  # JSON objects: their keys in any order
        answers = [(status, json.loads(body) if body.startswith(b"{") else body) for status, body in answers]
        assert answers[0] == answers[1] and answers[1][0] in (200, 400), path
    status = get_model_status_pb2.GetModelStatusRequest()
    status.model_spec.name = "mlp"
    metadata = get_model_metadata_pb2.GetModelMetadataRequest(metadata_field=["signature_def"])
    metadata.model_spec.name = "pair"
    answers = [[_grpc(running, model_service_pb2_grpc.ModelServiceStub, "GetModelStatus", status),
                _grpc(running, PREDICT, "GetModelMetadata", metadata),
                _grpc(running, KSERVE, "ModelMetadata", service_pb2.ModelMetadataRequest(name="cnn")),
                _grpc(running, KSERVE, "ServerReady", service_pb2.ServerReadyRequest())] for running in pair]
    for answer in answers:  # a packed map's bytes may list its entries in any order: compare the maps
        signature_defs = get_model_metadata_pb2.SignatureDefMap()
        answer[1].metadata["signature_def"].Unpack(signature_defs)
        answer[1].metadata["signature_def"].Pack(get_model_metadata_pb2.SignatureDefMap())
        answer.append(signature_defs)
    assert answers[0] == answers[1] and set(answers[1][4].signature_def) == {"pair", "__saved_model_init_op"}
    assert [s.version for s in answers[1][0].model_version_status] == [1, 2] and answers[1][3].ready


def test_requests_are_counted_once_wherever_they_were_parsed(workers_server):
    """Fresh connections land on either worker; the model process's metrics count each request once."""
    rest = workers_server.rest
    before = rest.call("/monitoring/prometheus/metrics")[1].decode()
    x = random_array((1, 16))
    for _ in range(8):
        assert rest.call("/v1/models/mlp:predict", {"instances": x.tolist()})[0] == 200
    for _ in range(4):
        _grpc(workers_server, PREDICT, "Predict", _predict("mlp", features=x))
    assert rest.call("/v1/models/mlp:predict", {"instances": [[1.0]]})[0] == 400
    after = rest.call("/monitoring/prometheus/metrics")[1].decode()

    def added(name, **labels):
        return metric(after, name, model="mlp", **labels) - metric(before, name, model="mlp", **labels)

    assert added("tftrt_serving_requests_total", api="rest_predict", status="OK") == 8
    assert added("tftrt_serving_requests_total", api="grpc_predict", status="OK") == 4
    assert added("tftrt_serving_requests_total", api="rest_predict", status="INVALID_ARGUMENT") == 1
    assert added("tftrt_serving_request_latency_seconds_count", api="rest_predict") == 9


def test_requests_parsed_by_different_workers_merge_into_batches(workers_batching_server, models):
    rest = workers_batching_server.rest
    feeds = [random_array((n, 32, 32, 3)) for n in (1, 2, 1, 3, 1, 2, 1, 1)]
    before = rest.call("/monitoring/prometheus/metrics")[1].decode()

    def call(ix):
        index, x = ix
        if index % 2:
            return np.array(rest.json("/v1/models/cnn:predict", {"instances": x.tolist()})[1]["predictions"])
        return tf.make_ndarray(next(iter(_grpc(workers_batching_server, PREDICT, "Predict",
                                               _predict("cnn", image=x)).outputs.values())))

    with concurrent.futures.ThreadPoolExecutor(len(feeds)) as pool:
        answers = list(pool.map(call, enumerate(feeds)))
    for x, answer in zip(feeds, answers):
        (want,) = reference(models, "cnn", 1, image=x).values()
        np.testing.assert_allclose(answer, want, **TOL)
    after = rest.call("/monitoring/prometheus/metrics")[1].decode()
    batches, rows = (metric(after, f"tftrt_serving_batch_size_{k}", model="cnn") -
                     metric(before, f"tftrt_serving_batch_size_{k}", model="cnn") for k in ("count", "sum"))
    assert rows == sum(len(x) for x in feeds) and batches < len(feeds)


def test_strings_int64_and_bool_tensors_answer_as_in_one_process(typed_server, tmp_path_factory):
    """String tensors (numpy object arrays) travel in the control messages, the others in shared memory."""
    root = tmp_path_factory.mktemp("typed_workers")
    module = Typed()
    tf.saved_model.save(module, str(root / "typed" / "1"), signatures={"serving_default": module.serve})
    body = {"instances": [{"text": "ab", "count": [1, -2], "flag": True},
                          {"text": {"b64": "/wA="}, "count": [3, 2 ** 40], "flag": False}]}
    kserve = {"inputs": [{"name": "text", "shape": [2], "datatype": "BYTES", "data": ["ab", "é"]},
                         {"name": "count", "shape": [2, 2], "datatype": "INT64", "data": [1, -2, 3, 2 ** 40]},
                         {"name": "flag", "shape": [2], "datatype": "BOOL", "data": [True, False]}]}
    with Server([ModelSpec("typed", str(root / "typed"))], frontend_workers=1) as running:
        workers = Rest(running.rest_port)
        for path, request in (("/v1/models/typed:predict", body), ("/v2/models/typed/infer", kserve)):
            answer = workers.json(path, request)
            assert answer == typed_server.rest.json(path, request) and answer[0] == 200


@pytest.fixture(scope="module")
def polled(models, tmp_path_factory):
    """mlp's version 1 alone under a base path of its own, polled every second, two front-end workers."""
    base = tmp_path_factory.mktemp("polled") / "mlp"
    shutil.copytree(os.path.join(models.root, "mlp", "1"), base / "1")
    with Server([ModelSpec("mlp", str(base))], frontend_workers=2, file_system_poll_wait_seconds=1) as running:
        yield types.SimpleNamespace(server=running, rest=Rest(running.rest_port), base=base)


def _wait_for(condition, seconds=60.0):
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


def test_a_new_version_shows_through_the_workers(polled, models):
    shutil.copytree(os.path.join(models.root, "mlp", "2"), polled.base / "2")
    _wait_for(lambda: [s["version"] for s in polled.rest.json("/v1/models/mlp")[1]["model_version_status"]
                       if s["state"] == "AVAILABLE"] == ["2"])
    x = random_array((2, 16))
    answer = _grpc(polled, PREDICT, "Predict", _predict("mlp", features=x))
    assert answer.model_spec.version.value == 2
    np.testing.assert_allclose(tf.make_ndarray(answer.outputs["logits"]),
                               reference(models, "mlp", 2, features=x)["logits"], **TOL)
    assert polled.rest.json("/v2/models/mlp")[1]["versions"] == ["2"]


def test_a_killed_worker_is_replaced_and_the_server_answers_meanwhile(polled, caplog):
    pool = polled.server.workers
    victim, survivor = pool.pids()
    os.kill(victim, signal.SIGKILL)
    _wait_for(lambda: victim not in pool.pids())
    x = {"instances": random_array((1, 16)).tolist()}
    statuses = [polled.rest.call("/v1/models/mlp:predict", x)[0] for _ in range(10)]  # the survivor answers
    _wait_for(pool.listening)
    statuses += [polled.rest.call("/v1/models/mlp:predict", x)[0] for _ in range(10)]
    assert statuses == [200] * 20 and pool.restarts == 1 and survivor in pool.pids()
    assert f"(pid {victim}) exited with code -9" in caplog.text


def _memfd_maps():
    with open("/proc/self/maps") as maps:
        return sum("tftrt-serve-tensors" in line for line in maps)


def _children():
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as stat:
                if int(stat.read().rsplit(")", 1)[1].split()[1]) == os.getpid():
                    found.append(int(pid))
        except (OSError, IndexError):
            pass
    return found


def test_stop_leaves_no_processes_and_no_shared_memory(models):
    shm, maps, children = sorted(os.listdir("/dev/shm")), _memfd_maps(), _children()
    server = Server([ModelSpec("mlp", os.path.join(models.root, "mlp"))], frontend_workers=2).start()
    pids = server.workers.pids()
    assert set(pids) <= set(_children()) and _memfd_maps() > maps
    server.stop()
    gc.collect()
    assert sorted(os.listdir("/dev/shm")) == shm and _memfd_maps() == maps and _children() == children
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_a_port_in_use_is_refused_not_shared(workers_server, models):
    """SO_REUSEPORT would let a second server's workers join the first's port: the second does not start."""
    with pytest.raises(OSError):
        Server([ModelSpec("mlp", os.path.join(models.root, "mlp"))], grpc_port=None,
               rest_port=workers_server.server.rest_port, frontend_workers=1).start()
    assert workers_server.rest.call("/readyz") == (200, b"ready")


def test_the_flag_sets_the_workers():
    args = build_parser().parse_args(["--model_base_path=/m", "--frontend_workers=3"])
    assert server_from_args(args).frontend_workers == 3
    assert server_from_args(build_parser().parse_args(["--model_base_path=/m"])).frontend_workers == 0
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--model_base_path=/m", "--frontend_workers=-1"])


def test_an_arena_shares_tensors_in_place_and_carries_what_does_not_fit():
    """Arrays go into one block; strings, and arrays that find no room, ride in the message; freed blocks merge."""
    writer = Arena(4096)
    reader = Arena(4096, os.dup(writer.fd))
    x, text = random_array((4, 8)), np.array([b"a", b"bc"], dtype=object)
    block, descriptors = writer.write({"x": x, "text": text})
    read = reader.read(descriptors)
    np.testing.assert_array_equal(read["x"], x)
    assert read["text"] is text and not read["x"].flags.owndata  # in place
    assert not read["x"].flags.writeable  # the writer may still write it: whoever must keep it still copies it
    big = writer.write({"big": random_array((1024,))})  # 4 KB: no room left
    assert big[0] == -1 and big[1][0][1].shape == (1024,)
    second, _ = writer.write({"y": random_array((8,))})
    writer.free(block)
    writer.free(second)
    bfloat16 = np.arange(6, dtype=ml_dtypes.bfloat16).reshape(2, 3)  # its dtype travels as itself, not a string
    block, descriptors = writer.write({"bf": bfloat16})
    assert reader.read(descriptors)["bf"].dtype == bfloat16.dtype and (reader.read(descriptors)["bf"] == bfloat16).all()
    writer.free(block)
    assert writer.used_bytes == 0 and writer.allocate(4096) == 0  # the blocks merged back into one


class _Runs:
    """Pickles as a call of os.system: what a subverted worker could send to run code in the model process."""

    def __reduce__(self):
        return os.system, ("true",)


def test_a_link_message_is_read_with_the_classes_messages_hold_and_nothing_else():
    items = [("predict", 7, "mlp", 1, "serving_default", ("logits",), [("x", np.array(["a", b"b"], dtype=object))]),
             ("view", 2, ModelSpec("mlp", "/m"), meta_graph_pb2.SignatureDef(method_name="m"), {np.dtype("f4")})]
    decoded = decode(pickle.dumps(items, protocol=pickle.HIGHEST_PROTOCOL))
    assert decoded[0][:6] == items[0][:6] and list(decoded[0][6][0][1]) == ["a", b"b"]
    assert decoded[1][2] == items[1][2] and decoded[1][3] == items[1][3] and decoded[1][4] == items[1][4]
    with pytest.raises(pickle.UnpicklingError, match="may not name posix.system"):
        decode(pickle.dumps([("predict", _Runs())]))


def test_a_worker_that_sends_a_message_it_may_not_is_ended(caplog):
    class Link:
        def receive(self):
            raise pickle.UnpicklingError("a link message may not name posix.system")

    class Process:
        pid, killed = 4321, False

        def kill(self):
            self.killed = True

    worker = types.SimpleNamespace(index=1, link=Link(), process=Process())
    WorkerPool._read(WorkerPool.__new__(WorkerPool), worker)  # returns: the reader stops, the watcher replaces it
    assert worker.process.killed
    assert "front-end worker 1 (pid 4321) sent a message it may not" in caplog.text


def test_items_the_model_process_sends_with_the_start_arguments_reach_the_worker(monkeypatch):
    """The model process's link sends what it queued together: a version change pushed just after a worker's start
    arguments can come in their message, and the worker acts on it once started."""
    from tftrt_py.serving import frontend_worker

    view = ("view", 2, "the new snapshot")
    message = [("the config", 1 << 20, "the first snapshot"), view]
    link = types.SimpleNamespace(receive=lambda: list(message))
    monkeypatch.setattr(frontend_worker, "Connection", lambda fd: fd)
    monkeypatch.setattr(frontend_worker, "Link", lambda conn, name, direct: link)
    started = []
    monkeypatch.setattr(frontend_worker, "start", lambda *args: started.append(args))
    monkeypatch.setattr(frontend_worker.sys, "argv", ["worker", "7"])
    frontend_worker.run()
    assert started == [("the config", link, 1 << 20, "the first snapshot", [view])]
