"""Native replays in the TRTEngineOp kernel: after a served run the kernel asks for a replay of those input
shapes and runs later calls itself, without Python. The CUDA driver calls are faked with ctypes callbacks over
host memory (the "device" is numpy arrays; the "graph" computes x * 2 + 1), so the kernel's side is checked here;
the cupy backend's replays are checked on the GPU (tests/engine/gpu/test_engine.py)."""
from __future__ import annotations

import ctypes
import gc
import threading
import weakref

import numpy as np
import pytest
import tensorflow as tf

from threads import run_threads
from tftrt_py.engine.replay import ENABLED, RUNS, Buffer, Functions, Replay
from tests.engine_op.test_kernel import as_array, fake, ops, segment  # noqa: F401 - fixtures

SET_CONTEXT = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)
TO_DEVICE = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_uint64, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p)
TO_HOST = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_uint64, ctypes.c_size_t, ctypes.c_void_p)
LAUNCH = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)
SYNCHRONIZE = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)
HOST_ALLOC = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t, ctypes.c_uint)
LIBC = ctypes.CDLL(None)
LIBC.malloc.restype = ctypes.c_void_p
LIBC.malloc.argtypes = [ctypes.c_size_t]


class FakeGpu:
    """Driver calls over host memory: a replay's "graph" (its id) computes y = x * 2 + 1 from its input buffer
    into its output buffer. Records calls, the graphs running at once, and can fail one call kind."""

    def __init__(self):
        self.graphs = {}  # graph id -> (input "device" array, output "device" array)
        self.calls = {"to_device": 0, "launch": 0}
        self.running, self.overlap = set(), []
        self.fail = None  # name of a call that returns CUDA error 700
        self.on_alloc = None  # called inside each pinned-block allocation
        self.meet = None  # a threading.Barrier the first launches wait at (in the graph they run), then no other
        self.lock = threading.Lock()

        def set_context(context):
            return 0

        def to_device(device, host, nbytes, stream):
            with self.lock:
                self.calls["to_device"] += 1
            ctypes.memmove(device, host, nbytes)
            return 0

        def launch(graph, stream):
            self.calls["launch"] += 1
            if self.fail == "launch":
                return 700
            with self.lock:
                if graph in self.running:
                    self.overlap.append(graph)
                self.running.add(graph)
            meet = self.meet
            if meet is not None:
                try:
                    meet.wait()
                except threading.BrokenBarrierError:  # no other launch came: the test's assertions say so
                    pass
                self.meet = None
            x, y = self.graphs[graph]
            np.multiply(x, 2, out=y)
            y += 1
            with self.lock:
                self.running.discard(graph)
            return 0

        def to_host(host, device, nbytes, stream):
            ctypes.memmove(host, device, nbytes)
            return 0

        def host_alloc(address, nbytes, flags):
            if self.fail == "host_alloc":
                return 2
            if self.on_alloc is not None:
                self.on_alloc()
            self.calls["host_alloc"] += 1
            address[0] = LIBC.malloc(nbytes)
            return 0

        self.calls["host_alloc"] = 0
        self.callbacks = [SET_CONTEXT(set_context), TO_DEVICE(to_device), TO_HOST(to_host), LAUNCH(launch),
                          SYNCHRONIZE(lambda stream: 0), HOST_ALLOC(host_alloc)]
        # blocks are freed by libc's free: a pool may go after this test (the kernel's tensors outlive it)
        self.functions = Functions(*[ctypes.cast(c, ctypes.c_void_p).value for c in self.callbacks],
                                   ctypes.cast(LIBC.free, ctypes.c_void_p).value)

    def replay(self, shape, limit=1):
        """A Replay of a float32 engine y = x * 2 + 1 at `shape`, with its own buffers and graph id."""
        graph = len(self.graphs) + 1
        pinned_in, pinned_out = np.zeros(shape, np.float32), np.zeros(shape, np.float32)
        device_in, device_out = np.zeros(shape, np.float32), np.zeros(shape, np.float32)
        self.graphs[graph] = (device_in, device_out)
        keep = (pinned_in, pinned_out, device_in, device_out, self)
        return Replay(self.functions, context=1, stream=1, graph=graph,
                      inputs=[Buffer(pinned_in.nbytes, pinned_in.ctypes.data, device_in.ctypes.data)],
                      outputs=[Buffer(pinned_out.nbytes, pinned_out.ctypes.data, device_out.ctypes.data, shape)],
                      keep=keep, limit=limit)


@pytest.fixture
def gpu():
    return FakeGpu()


def engine_op(ops):
    seg = segment(lambda x: x * 2 + 1, tf.TensorSpec([None, 3], tf.float32))

    @tf.function(input_signature=[tf.TensorSpec([None, 3], tf.float32)])
    def f(x):
        return ops.trt_engine_op([x], [], OutT=[tf.float32], segment_func=seg)
    return f


def offering(fake, gpu, limit=1, answer=None):
    """Python serves every call (x * 2 + 1) and answers each replay request with a fresh replay (or `answer`)."""
    fake.respond = lambda h, inputs, assets: [as_array(inputs[0]) * 2 + 1]
    fake.asked, fake.offered = [], []

    def replay(handle, inputs):
        fake.asked.append(tuple(as_array(inputs[0]).shape))
        if answer is not None:
            return answer
        r = gpu.replay(tuple(as_array(inputs[0]).shape), limit)
        fake.offered.append(r)
        return r.pack(), r
    fake.respond_replay = replay


def call(f, rows, seed):
    x = np.random.default_rng(seed).standard_normal((rows, 3)).astype(np.float32)
    np.testing.assert_array_equal(f(x)[0].numpy(), x * 2 + 1)


def test_after_one_served_call_the_kernel_runs_those_shapes_without_python(ops, fake, gpu):
    offering(fake, gpu)
    f = engine_op(ops)
    for seed in range(5):
        call(f, 4, seed)
    assert len(fake.runs) == 1 and fake.asked == [(4, 3)]
    assert fake.offered[0].runs == 4 == gpu.calls["launch"]
    times = fake.offered[0].times()
    assert all(t > 0 for t in times.values()) and times["kernel"] > times["device"]


def test_other_shapes_go_through_python_and_get_their_own_replay(ops, fake, gpu):
    offering(fake, gpu)
    f = engine_op(ops)
    for seed, rows in enumerate([4, 2, 4, 2, 7]):
        call(f, rows, seed)
    assert fake.asked == [(4, 3), (2, 3), (7, 3)] and len(fake.runs) == 3
    assert [r.runs for r in fake.offered] == [1, 1, 0]


def test_a_revoked_replay_sends_calls_back_to_python_and_is_dropped(ops, fake, gpu):
    offering(fake, gpu)
    f = engine_op(ops)
    call(f, 4, 0)
    call(f, 4, 1)
    replay = fake.offered[0]
    gone = weakref.ref(replay)
    replay.revoke()
    del replay
    call(f, 4, 2)  # Python serves, drops the revoked replay and is asked for a new one
    assert len(fake.runs) == 2 and len(fake.asked) == 2
    fake.offered.pop(0)
    gc.collect()
    assert gone() is None  # the kernel released its reference
    call(f, 4, 3)
    assert len(fake.runs) == 2 and fake.offered[0].runs == 1


def test_a_failing_cuda_call_falls_back_to_python_for_good(ops, fake, gpu, caplog):
    offering(fake, gpu)
    f = engine_op(ops)
    call(f, 4, 0)
    gpu.fail = "launch"
    call(f, 4, 1)  # the replay fails; Python serves the same call
    assert len(fake.runs) == 2 and fake.offered[0].runs == 0
    assert "native replay failed (CUDA error 700)" in caplog.text
    launches = gpu.calls["launch"]
    gpu.fail = None
    call(f, 4, 2)
    assert gpu.calls["launch"] == launches  # the failed replay is never run again


def test_false_means_never_ask_again(ops, fake, gpu):
    offering(fake, gpu, answer=False)
    f = engine_op(ops)
    for seed in range(4):
        call(f, 4, seed)
    assert fake.asked == [(4, 3)] and len(fake.runs) == 4


def test_none_means_ask_again_after_64_python_runs(ops, fake, gpu):
    offering(fake, gpu, answer=None)
    fake.respond_replay = lambda handle, inputs: fake.asked.append(1)  # None
    f = engine_op(ops)
    for seed in range(70):
        call(f, 2, seed)
    assert len(fake.asked) == 2 and len(fake.runs) == 70


@pytest.mark.parametrize("packed, message", [
    (lambda p: [1] + p[1:], "version 1"),
    (lambda p: p[:-1], "too short"),
    (lambda p: p + [0], "too long"),
    (lambda p: p[:8] + [0] + p[9:], "null address"),  # context
    (lambda p: p[:14] + [p[14] + 4] + p[15:], "holds 52 bytes"),  # input nbytes
    (lambda p: p[:-2] + [5, 3], "48 bytes for shape [5,3]"),  # output dims
    (42, "list of ints"),
    (lambda p: p[:-1] + ["3"], "an integer is required"),
])
def test_malformed_replays_are_refused_and_logged(ops, fake, gpu, packed, message, caplog):
    offering(fake, gpu)
    r = gpu.replay((4, 3))
    bad = packed(r.pack()) if callable(packed) else packed
    fake.respond_replay = lambda handle, inputs: (bad, r)
    f = engine_op(ops)
    for seed in range(3):
        call(f, 4, seed)
    assert len(fake.runs) == 3 and r.runs == 0
    assert message in caplog.text and "no native replay" in caplog.text


def test_concurrent_callers_share_at_most_limit_replays_never_one_at_once(ops, fake, gpu):
    """The first replay's launch waits (up to 5 s) for a second launch: the other callers, finding it busy, ask for
    a replay of their own, which makes the second; beyond the limit they run through Python."""
    offering(fake, gpu, limit=2)
    gpu.meet = threading.Barrier(2, timeout=5)
    f = engine_op(ops)
    run_threads(lambda k: [call(f, 4, 1000 * k + i) for i in range(25)], range(6))
    assert len(fake.offered) == 2 and not gpu.overlap
    assert sum(r.runs for r in fake.offered) + len(fake.runs) == 150


def test_large_buffers_go_in_parallel_chunks(ops, fake, gpu):
    offering(fake, gpu)
    f = engine_op(ops)
    rows = ((20 << 20) + 6) // 12  # 20 MiB and a bit: 21 chunks, each sent to the device once it is in
    call(f, rows, 0)
    before = gpu.calls["to_device"]
    call(f, rows, 1)
    assert gpu.calls["to_device"] - before == 21
    assert fake.offered[0].state[RUNS] == 1 and fake.offered[0].state[ENABLED] == 1


def test_outputs_land_in_pinned_blocks_that_become_the_output_tensors(ops, fake, gpu):
    offering(fake, gpu)
    f = engine_op(ops)
    for seed in range(10):
        call(f, 4, seed)  # each output is dropped before the next call: its block comes back
    replay = fake.offered[0]
    assert replay.outputs_handed() == (9, 0) and gpu.calls["host_alloc"] == 1


def test_outputs_tensorflow_holds_keep_their_values_and_later_outputs_are_copied_once_blocks_run_out(ops, fake, gpu):
    offering(fake, gpu)
    f = engine_op(ops)
    call(f, 4, 0)  # Python serves it and gets the replay
    inputs = [np.random.default_rng(seed).standard_normal((4, 3)).astype(np.float32) for seed in range(7)]
    held = [f(x)[0] for x in inputs]  # TensorFlow holds every output: 4 in pinned blocks, then copies
    for x, y in zip(inputs, held):
        np.testing.assert_array_equal(y.numpy(), x * 2 + 1)
    assert fake.offered[0].outputs_handed() == (4, 3) and gpu.calls["host_alloc"] == 4
    del held
    call(f, 4, 99)
    assert fake.offered[0].outputs_handed() == (5, 3) and gpu.calls["host_alloc"] == 4


def test_an_output_dropped_while_the_kernel_allocates_a_block_returns_its_own(ops, fake, gpu):
    """The allocation runs outside the pool's lock: here the tensor is dropped from inside it, on the same thread."""
    offering(fake, gpu)
    f = engine_op(ops)
    call(f, 4, 0)
    x = np.ones((4, 3), np.float32)
    held = [f(x)[0]]  # the first block, held
    gpu.on_alloc = held.clear  # the next run allocates a second block; meanwhile the first comes back
    np.testing.assert_array_equal(f(x)[0].numpy(), x * 2 + 1)
    gpu.on_alloc = None
    call(f, 4, 1)
    assert gpu.calls["host_alloc"] == 2 and fake.offered[0].outputs_handed() == (3, 0)


def test_outputs_are_copied_where_pinned_memory_cannot_be_allocated(ops, fake, gpu):
    offering(fake, gpu)
    gpu.fail = "host_alloc"
    f = engine_op(ops)
    for seed in range(3):
        call(f, 4, seed)
    assert fake.offered[0].outputs_handed() == (0, 2) and fake.offered[0].runs == 2


# --- the dispatcher's side: real kernel, real engine op, a backend offering fake replays -------------

@pytest.fixture
def converted(tmp_path):
    """A converted SavedModel computing x * 2 + 1 on [None, 3] (one engine op; numpy backend)."""
    from tftrt_py import trt_convert as trt

    module = tf.Module()
    module.f = tf.function(lambda x: tf.identity(x * 2.0 + 1.0, name="y"),
                           input_signature=[tf.TensorSpec([None, 3], tf.float32)])
    tf.saved_model.save(module, str(tmp_path / "model"), signatures=module.f)
    converter = trt.TrtGraphConverterV2(input_saved_model_dir=str(tmp_path / "model"),
                                        conversion_params=trt.TrtConversionParams(minimum_segment_size=2))
    func = converter.convert()
    (name,) = [n.name for n in converter._converted_graph_def.node if n.op == "TRTEngineOp"]
    return func, name


def serve(func, rows, seed):
    x = np.random.default_rng(seed).standard_normal((rows, 3)).astype(np.float32)
    (out,) = func(tf.constant(x)).values()
    np.testing.assert_allclose(out.numpy(), x * 2 + 1, rtol=1e-6)


def op_stats(name):
    from tftrt_py import trt_convert as trt

    return trt.engine_op_stats()[name]


@pytest.fixture
def replaying(monkeypatch, gpu):
    """Execution contexts offer FakeGpu replays (limit: the pool's size)."""
    from tftrt_py.engine.runtime import ExecutionContext

    monkeypatch.setattr(ExecutionContext, "replays", property(lambda self: True))
    monkeypatch.setattr(ExecutionContext, "native_replay",
                        lambda self, inputs, out_dtypes: gpu.replay(tuple(inputs[0].shape)))
    return gpu


def test_engine_op_hands_out_replays_and_counts_their_runs(converted, replaying):
    func, name = converted
    for seed in range(5):
        serve(func, 4, seed)
    stats = op_stats(name)
    assert stats["native_runs"] == 4 and stats["engine_runs"] == 5
    assert stats["builds"] == 1 and stats["hits"] == 4  # the first call built the engine
    assert replaying.calls["launch"] == 4


def test_setting_a_profiler_revokes_the_replays(converted, replaying):
    from tftrt_py.engine_op import dispatcher

    func, name = converted
    serve(func, 4, 0)
    serve(func, 4, 1)
    (op,) = [op for op in dispatcher.engine_ops().values() if op.name == name]
    layers = []
    op.set_profiler(type("Profiler", (), {"report_layer_time": lambda self, name, ms: layers.append(name)})())
    launches = replaying.calls["launch"]
    for seed in range(3):
        serve(func, 4, 2 + seed)
    assert replaying.calls["launch"] == launches and layers  # every call through Python, with its layer times
    assert op_stats(name)["native_runs"] == 1 and op_stats(name)["engine_runs"] == 5


def test_cpu_backends_offer_no_replays(converted, monkeypatch):
    from tftrt_py.engine_op import dispatcher

    asked = []
    real = dispatcher.replay
    monkeypatch.setattr(dispatcher, "replay", lambda *a: asked.append(real(*a)) or asked[-1])
    func, name = converted
    for seed in range(4):
        serve(func, 4, seed)
    assert asked == [False] and op_stats(name)["native_runs"] == 0 and op_stats(name)["engine_runs"] == 4


def test_the_switch_keeps_every_call_in_python(converted, replaying, monkeypatch):
    from tftrt_py.engine_op.op import REPLAY_ENV

    monkeypatch.setenv(REPLAY_ENV, "0")
    func, name = converted
    for seed in range(3):
        serve(func, 4, seed)
    assert replaying.calls["launch"] == 0 and op_stats(name)["engine_runs"] == 3
