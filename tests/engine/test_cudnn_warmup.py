"""cuDNN plans compiled ahead in worker processes (engine/backends/cupy/cudnn_warmup.py), without a GPU: a worker
rebuilds each convolution spec as the build will see it (same signature, shapes, dtypes, quantization), the specs
are shared out among at most WORKERS processes that are waited for and ended when late, and nothing starts when
the driver's JIT cache is off, no spec is a convolution or the GPU has too little memory free for a worker. The
runtime-compiled plans the workers answer with (serialized) are offered to this process's graphs, each answer's
fields checked first. A worker runs each candidate it built once, so cupy's kernels compile there."""
from __future__ import annotations

import io
import json
import subprocess
from types import SimpleNamespace

import numpy as np
import pytest

from networks import conv_relu_pool_net
from tftrt_py.engine.backends.cupy import _device, cudnn_warmup, helper_processes
from tftrt_py.engine.backends.cupy.ops import conv
from tftrt_py.engine.backends.cupy.ops.base import BuildOptions, Spec


def conv_spec(name="conv", quant=None, batch=4) -> Spec:
    layer = next(l for l in conv_relu_pool_net(batch).layers if l.kind == "Convolution")
    layer.name = name
    layer.outputs[0].dynamic_range = 3.5
    options = BuildOptions(allow_tf32=True, max_workspace=1 << 20, cudnn_plans=3, cudnn_runtime_plans=0)
    dtype = "int8" if quant else "float16"
    return Spec(layer, [(batch, 8, 8, 4 if quant else 3)], [dtype], [(batch, 8, 8, 5)], [dtype], "float16",
                options, quant=quant)


def round_trip(spec: Spec) -> Spec:
    return cudnn_warmup._spec(json.loads(json.dumps(cudnn_warmup.describe(spec), default=cudnn_warmup._plain)),
                              tuner="the worker's context")


@pytest.mark.parametrize("quant", [None, {"format": "INT8", "in_scale": np.float32(0.02), "dual_scale": None}])
def test_a_worker_rebuilds_the_spec_the_build_times(quant):
    spec = conv_spec(quant=quant)
    rebuilt = round_trip(spec)
    assert rebuilt.signature() == spec.signature()
    assert (rebuilt.in_shapes, rebuilt.out_shapes, rebuilt.cdt) == (spec.in_shapes, spec.out_shapes, spec.cdt)
    assert rebuilt.quant == (None if quant is None else {"format": "INT8", "in_scale": pytest.approx(0.02),
                                                          "dual_scale": None})
    assert rebuilt.layer.outputs[0].dynamic_range == 3.5
    assert {k: (v.shape, v.dtype) for k, v in rebuilt.layer.weights.items()} == \
        {k: (v.shape, v.dtype) for k, v in spec.layer.weights.items()}
    o = rebuilt.options
    assert (o.allow_tf32, o.max_workspace, o.cudnn_plans, o.cudnn_runtime_plans, o.tuner) == \
        (True, 1 << 20, 3, 0, "the worker's context")


class FakePopen:
    """Records the specs each worker process is given; answers `answers` (lines) on its stdout; a hang
    (TimeoutExpired) when waited for."""

    started, hang, answers = [], False, []

    class Stdin:
        def __init__(self):
            self.written = b""

        def write(self, data):
            self.written += data

        def close(self):
            FakePopen.started.append(json.loads(self.written) if self.written else "no work")

    def __init__(self, command, stdin, stdout, stderr, env):
        self.command, self.killed = command, False
        self.stdin = FakePopen.Stdin()
        self.stdout = io.BytesIO(b"".join(FakePopen.answers))

    def wait(self, timeout=None):
        if FakePopen.hang and not self.killed:
            raise subprocess.TimeoutExpired(self.command, timeout)
        return 0

    def kill(self):
        self.killed = True

    def poll(self):
        return None


@pytest.fixture
def popen(monkeypatch):
    FakePopen.started, FakePopen.hang, FakePopen.answers = [], False, []
    monkeypatch.setattr(helper_processes.subprocess, "Popen", FakePopen)
    monkeypatch.setattr(helper_processes, "_waiting", {})
    monkeypatch.delenv("CUDA_CACHE_DISABLE", raising=False)
    monkeypatch.setattr(cudnn_warmup.os, "cpu_count", lambda: 16)
    monkeypatch.setattr(cudnn_warmup, "_free_device_bytes", lambda: 64 << 30)
    return FakePopen


class Candidate:
    def __init__(self, name, ran, fails=False):
        self.name, self.ran, self.fails, self.workspace = name, ran, fails, 64

    def run(self, rc, ins, outs):
        self.ran.append((self.name, ins, outs))
        if self.fails:
            raise RuntimeError("launch failed")


class WorkerContext:
    """A RunContext that is its own stream."""

    def __init__(self):
        self.stream, self.workspace = self, 0

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def synchronize(self):
        pass

    def ensure_workspace(self, nbytes):
        self.workspace = max(self.workspace, nbytes)


class FakeCupy:
    """cupy's zeros and empty: arrays as (kind, shape, dtype); `fail` runs out of memory."""

    def __init__(self, fail=False):
        self.fail = fail

    def zeros(self, shape, dtype):
        if self.fail:
            raise MemoryError("out of device memory")
        return ("zeros", shape, dtype)

    def empty(self, shape, dtype):
        return ("empty", shape, dtype)


def test_a_worker_runs_every_candidate_it_built_once_on_zeros(monkeypatch):
    """Its kernels compile at that first launch, into the cache the build reads; one failing stops no other."""
    monkeypatch.setattr(_device, "require", lambda: FakeCupy())
    ran, rc = [], WorkerContext()
    candidates = [Candidate("a", ran, fails=True), Candidate("b", ran)]
    cudnn_warmup._run_once(candidates, conv_spec(), rc)
    inputs, outputs = [("zeros", (4, 8, 8, 3), "float16")], [("empty", (4, 8, 8, 5), "float16")]
    assert ran == [("a", inputs, outputs), ("b", inputs, outputs)] and rc.workspace == 64


def test_a_worker_without_memory_for_the_operands_runs_nothing(monkeypatch):
    monkeypatch.setattr(_device, "require", lambda: FakeCupy(fail=True))
    ran = []
    cudnn_warmup._run_once([Candidate("a", ran)], conv_spec(), WorkerContext())
    assert ran == []


def test_the_convolutions_are_shared_out_among_at_most_workers_processes(popen):
    specs = [conv_spec(f"conv_{i}") for i in range(11)]
    cudnn_warmup.warm(specs)
    assert len(popen.started) == cudnn_warmup.WORKERS
    assert sorted(d["name"] for part in popen.started for d in part) == sorted(s.layer.name for s in specs)


def test_workers_started_ahead_take_the_specs_and_those_not_needed_end(popen):
    cudnn_warmup.stand_by()
    ahead = [proc for proc, _ in helper_processes._waiting[cudnn_warmup.__name__]]
    assert len(ahead) == cudnn_warmup.WORKERS and popen.started == []
    cudnn_warmup.warm([conv_spec(f"conv_{i}") for i in range(3)])
    assert [[d["name"] for d in part] for part in popen.started[:3]] == [["conv_0"], ["conv_1"], ["conv_2"]]
    assert popen.started[3:] == ["no work"] * (cudnn_warmup.WORKERS - 3)
    assert cudnn_warmup.__name__ not in helper_processes._waiting


def test_a_worker_started_ahead_that_ended_meanwhile_is_replaced(popen):
    """Its pipe is broken: its share of the specs goes to a new process."""
    cudnn_warmup.stand_by()
    (ended, _), *_ = helper_processes._waiting[cudnn_warmup.__name__]

    def broken(data):
        raise BrokenPipeError("the helper ended")

    ended.stdin.write = broken
    popen.started.clear()
    cudnn_warmup.warm([conv_spec("conv_0")])
    assert [d["name"] for part in popen.started if part != "no work" for d in part] == ["conv_0"]


def test_a_late_worker_is_ended(popen, monkeypatch):
    popen.hang = True
    monkeypatch.setattr(cudnn_warmup, "WAIT_S", 0.0)
    cudnn_warmup.warm([conv_spec()])  # returns: the process was killed, then waited for
    assert len(popen.started) == 1


def test_nothing_starts_without_the_driver_cache_or_without_a_convolution(popen, monkeypatch):
    matmul = Spec(SimpleNamespace(kind="MatrixMultiply", name="mm"), [], [], [], [], "float16", BuildOptions())
    cudnn_warmup.warm([matmul])
    monkeypatch.setenv("CUDA_CACHE_DISABLE", "1")
    cudnn_warmup.stand_by()
    cudnn_warmup.warm([conv_spec()])
    assert popen.started == [] and helper_processes._waiting.get(cudnn_warmup.__name__, []) == []


def test_each_worker_needs_its_share_of_free_device_memory(popen, monkeypatch):
    specs = [conv_spec(f"conv_{i}") for i in range(11)]
    monkeypatch.setattr(cudnn_warmup, "_free_device_bytes", lambda: 3 * cudnn_warmup.WORKER_BYTES + 1)
    cudnn_warmup.warm(specs)
    assert len(popen.started) == 3
    popen.started.clear()
    monkeypatch.setattr(cudnn_warmup, "_free_device_bytes", lambda: cudnn_warmup.WORKER_BYTES - 1)
    cudnn_warmup.warm(specs)
    assert popen.started == []


OFFER = conv.PlanOffer("eng52", 4096, {"X": 1, "W": 2, "Y": 6}, bytes(range(256)) * 300)


def test_an_answer_reads_back_as_the_plan_offered():
    line = cudnn_warmup.answer('["int8", [8, 64]]', 36, OFFER).encode()
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    assert cudnn_warmup.parse_answer(line) == ('["int8", [8, 64]]', 36, OFFER)


@pytest.mark.parametrize("change, error", [
    ({"index": -1}, ValueError), ({"workspace": -8}, ValueError), ({"index": "36"}, TypeError),
    ({"uids": {"X": "1"}}, TypeError), ({"uids": [1, 2]}, TypeError), ({"key": None}, TypeError),
    ({"data": "not base64!"}, ValueError), ({"data": "A" * (cudnn_warmup.MAX_PLAN_BYTES * 2)}, ValueError)])
def test_an_answer_with_a_field_out_of_bounds_is_refused(change, error):
    d = json.loads(cudnn_warmup.answer("key", 36, OFFER))
    d.update(change)
    with pytest.raises(error):
        cudnn_warmup.parse_answer(json.dumps(d).encode())
    d = json.loads(cudnn_warmup.answer("key", 36, OFFER))
    del d["uids"]
    with pytest.raises(KeyError):
        cudnn_warmup.parse_answer(json.dumps(d).encode())


def test_the_plans_workers_answer_with_are_offered_until_an_unreadable_answer(popen, monkeypatch):
    offered = []
    monkeypatch.setattr(conv, "offer_plan", lambda key, index, offer: offered.append((key, index, offer)))
    popen.answers = [cudnn_warmup.answer("a", 3, OFFER).encode(), b"garbled\n",
                     cudnn_warmup.answer("b", 4, OFFER).encode()]
    cudnn_warmup.warm([conv_spec()])
    assert offered == [("a", 3, OFFER)]
