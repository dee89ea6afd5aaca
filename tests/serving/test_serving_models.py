"""Versions come and go while the server runs: it polls each base path, loads a version its policy newly selects
(requests served meanwhile), then unloads the versions no longer selected (status END, requests NOT_FOUND), and an
unloaded version's engine ops go with it; a version that fails to load leaves the serving one in place."""
import os
import shutil
import threading
import time

import numpy as np
import pytest
from tensorflow.python.saved_model import loader_impl

from conftest import Rest, reference
from support import random_array
from tftrt_py.engine_op import dispatcher
from tftrt_py.serving import BatchingOptions, ModelSpec, Server, VersionPolicy
from tftrt_py.serving.models import ModelManager

TOL = dict(rtol=1e-5, atol=1e-5)
POLL = 0.05


def segment_keys(path):
    """The segment keys of the TRTEngineOp nodes of the converted SavedModel at `path`."""
    graph = loader_impl.parse_saved_model(path).meta_graphs[0].graph_def
    nodes = list(graph.node) + [n for f in graph.library.function for n in f.node_def]
    return {n.attr["segment_key"].s.decode() or n.name for n in nodes if n.op == "TRTEngineOp"}


class Versions:
    """A base path whose numbered folders are copies of the converted mlp versions 1 and 2 (`source`)."""

    def __init__(self, models, base):
        self.models, self.base = models, str(base)
        os.makedirs(self.base)
        self.keys = {v: segment_keys(self.source(v)) for v in (1, 2)}
        assert self.keys[1] and self.keys[2] and not self.keys[1] & self.keys[2]

    def source(self, mlp_version):
        return os.path.join(self.models.root, "mlp", str(mlp_version))

    def add(self, version, mlp_version):
        """Copy the model next to its final place, then rename: a poll never sees half a version."""
        staging = os.path.join(self.base, f".staging-{version}")
        shutil.copytree(self.source(mlp_version), staging)
        os.rename(staging, os.path.join(self.base, str(version)))

    def remove(self, version):
        shutil.rmtree(os.path.join(self.base, str(version)))


@pytest.fixture
def versions(models, tmp_path):
    return Versions(models, tmp_path / "mlp")


@pytest.fixture
def known_ops():
    """Engine ops alive before the test (other servers' models): the test counts only the ops it makes."""
    return set(dispatcher.engine_ops())


def live_ops(known):
    """Segment keys of the engine ops made since `known`, one entry per live op."""
    return sorted(key[0] for key in dispatcher.engine_ops() if key not in known)


def serve(versions, policy=VersionPolicy(), batching=None):
    return Server([ModelSpec("mlp", versions.base, policy)], grpc_port=None, batching=batching,
                  file_system_poll_wait_seconds=POLL)


def states(rest):
    status, body = rest.json("/v1/models/mlp")
    assert status == 200
    return {int(s["version"]): s["state"] for s in body["model_version_status"]}


def wait_for_states(rest, want, timeout=60):
    deadline = time.monotonic() + timeout
    while states(rest) != want and time.monotonic() < deadline:
        time.sleep(POLL)
    assert states(rest) == want


def predict(rest, x, version=None):
    path = "/v1/models/mlp" + (f"/versions/{version}" if version else "") + ":predict"
    return rest.json(path, {"inputs": x.tolist()})


def test_a_new_version_loads_then_the_old_one_unloads_with_its_engine_ops(versions, models, known_ops):
    versions.add(1, 1)
    with serve(versions) as server:
        rest, x = Rest(server.rest_port), random_array((3, 16))
        status, body = predict(rest, x)
        assert status == 200
        np.testing.assert_allclose(body["outputs"]["logits"], reference(models, "mlp", 1, features=x)["logits"], **TOL)
        assert live_ops(known_ops) == sorted(versions.keys[1])

        answers, done = [], threading.Event()

        def client():  # requests during the swap: each answered, by version 1 or version 2
            while not done.is_set():
                answers.append(predict(rest, x))
        thread = threading.Thread(target=client)
        thread.start()
        try:
            versions.add(2, 2)
            wait_for_states(rest, {1: "END", 2: "AVAILABLE"})
        finally:
            done.set()
            thread.join()
        served = {v: reference(models, "mlp", v, features=x)["logits"] for v in (1, 2)}
        assert answers and all(status == 200 for status, _ in answers)
        assert all(any(np.allclose(body["outputs"]["logits"], want, **TOL) for want in served.values())
                   for _, body in answers)

        status, body = predict(rest, x)
        assert status == 200
        np.testing.assert_allclose(body["outputs"]["logits"], served[2], **TOL)
        status, body = predict(rest, x, version=1)
        assert status == 404 and "Specific(mlp, 1)" in body["error"]
        assert rest.json("/v1/models/mlp/versions/1")[1]["model_version_status"][0]["state"] == "END"
        # version 1's engine ops go once no request holds it: at the refresh that unloads it, or a later one
        deadline = time.monotonic() + 10
        while live_ops(known_ops) != sorted(versions.keys[2]) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert live_ops(known_ops) == sorted(versions.keys[2])


def test_a_removed_version_folder_unloads_that_version(versions, models, known_ops):
    versions.add(1, 1)
    versions.add(2, 2)
    with serve(versions, VersionPolicy("all")) as server:
        rest, x = Rest(server.rest_port), random_array((2, 16))
        assert states(rest) == {1: "AVAILABLE", 2: "AVAILABLE"}
        for version in (1, 2):
            assert predict(rest, x, version)[0] == 200
        assert live_ops(known_ops) == sorted(versions.keys[1] | versions.keys[2])
        versions.remove(1)
        wait_for_states(rest, {1: "END", 2: "AVAILABLE"})
        assert predict(rest, x, version=1)[0] == 404
        status, body = predict(rest, x, version=2)
        assert status == 200
        np.testing.assert_allclose(body["outputs"]["logits"], reference(models, "mlp", 2, features=x)["logits"], **TOL)
        assert live_ops(known_ops) == sorted(versions.keys[2])


def test_ten_version_swaps_end_with_one_versions_engine_ops(versions, models, known_ops):
    """With batching on, so batch queues are covered too."""
    batching = BatchingOptions(max_batch_size=8, batch_timeout_micros=1000, num_batch_threads=1)
    versions.add(1, 1)
    with serve(versions, batching=batching) as server:
        rest, x = Rest(server.rest_port), random_array((2, 16))
        for version in range(2, 12):
            versions.add(version, 2 - version % 2)  # copies of mlp 1 and 2 in turn: the engines differ each swap
            wait_for_states(rest, {**{v: "END" for v in range(1, version)}, version: "AVAILABLE"})
            status, body = predict(rest, x)
            assert status == 200
            np.testing.assert_allclose(body["outputs"]["logits"],
                                       reference(models, "mlp", 2 - version % 2, features=x)["logits"], **TOL)
            versions.remove(version - 1)
        assert live_ops(known_ops) == sorted(versions.keys[1])  # version 11 is a copy of mlp 1


def test_a_version_that_fails_to_load_leaves_the_serving_one(versions, models):
    versions.add(1, 1)
    with serve(versions) as server:
        rest, x = Rest(server.rest_port), random_array((2, 16))
        os.makedirs(os.path.join(versions.base, "2"))
        with open(os.path.join(versions.base, "2", "saved_model.pb"), "wb") as f:
            f.write(b"not a SavedModel")
        deadline = time.monotonic() + 60
        while states(rest).get(2) != "END" and time.monotonic() < deadline:
            time.sleep(POLL)
        status, body = rest.json("/v1/models/mlp/versions/2")
        (entry,) = body["model_version_status"]
        assert entry["state"] == "END" and entry["status"]["error_code"] == "INTERNAL"
        time.sleep(5 * POLL)  # later polls neither retry version 2 nor unload version 1
        assert states(rest) == {1: "AVAILABLE", 2: "END"}
        status, body = predict(rest, x)
        assert status == 200
        np.testing.assert_allclose(body["outputs"]["logits"], reference(models, "mlp", 1, features=x)["logits"], **TOL)


def test_poll_interval_zero_looks_only_at_start(versions):
    versions.add(1, 1)
    with Server([ModelSpec("mlp", versions.base)], grpc_port=None, file_system_poll_wait_seconds=0) as server:
        rest = Rest(server.rest_port)
        versions.add(2, 2)
        time.sleep(0.5)
        assert states(rest) == {1: "AVAILABLE"}


def test_a_version_in_use_when_unloaded_goes_at_a_later_refresh(versions, known_ops):
    versions.add(1, 1)
    manager = ModelManager([ModelSpec("mlp", versions.base)])
    manager.load()
    assert manager.refresh() is False  # nothing changed
    in_flight = manager.servable("mlp").signature("")  # what a request running on version 1 holds
    in_flight.run({"features": random_array((2, 16))})
    versions.add(2, 2)
    assert manager.refresh() is True
    assert [(s.version, s.state) for s in manager.status("mlp")] == [(1, "END"), (2, "AVAILABLE")]
    assert [s.version for s in manager.servables()] == [2]
    assert live_ops(known_ops) == sorted(versions.keys[1])  # still in use
    del in_flight
    manager.refresh()
    assert live_ops(known_ops) == []  # version 2 never ran: no op of its own yet


def test_a_negative_poll_interval_is_refused():
    with pytest.raises(ValueError, match="file_system_poll_wait_seconds must be >= 0"):
        Server([ModelSpec("mlp", "/m")], file_system_poll_wait_seconds=-1)
