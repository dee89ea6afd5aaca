"""An engine op's context pool: concurrent callers each get an execution context of their own."""
import threading
import time

import numpy as np
import pytest

from tftrt_py.engine import Builder, BuilderConfig, Network
from tftrt_py.engine_op.pool import CONTEXTS_ENV, ContextPool, contexts_per_engine


class SlowEngine:
    """Contexts that take a while per call and record how many run at once."""

    name = "slow"

    def __init__(self, fail_after=None):
        self.made, self.running, self.peak = 0, 0, 0
        self.fail_after = fail_after
        self.lock = threading.Lock()

    def create_execution_context(self):
        if self.fail_after is not None and self.made >= self.fail_after:
            raise MemoryError("out of GPU memory (simulated)")
        self.made += 1
        engine = self

        class Context:
            profiler = None

            def execute_v2(self, inputs, outputs=None):
                with engine.lock:
                    engine.running += 1
                    engine.peak = max(engine.peak, engine.running)
                time.sleep(0.05)
                with engine.lock:
                    engine.running -= 1
                return [inputs[0] * 2]
        return Context()


def call_from_threads(pool, n):
    results = [None] * n

    def call(i):
        results[i] = pool.execute_v2([np.full(3, i, np.float32)])[0]
    threads = [threading.Thread(target=call, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def test_concurrent_callers_run_at_once_up_to_the_pool_size():
    engine = SlowEngine()
    pool = ContextPool(engine, size=3)
    results = call_from_threads(pool, 8)
    assert [r.tolist() for r in results] == [[2.0 * i] * 3 for i in range(8)]
    assert engine.made == 3 == len(pool) and engine.peak == 3


def test_a_single_caller_uses_one_context():
    engine = SlowEngine()
    pool = ContextPool(engine, size=4)
    for i in range(3):
        pool.execute_v2([np.ones(2, np.float32)])
    assert engine.made == 1


def test_a_context_that_cannot_be_made_caps_the_pool(caplog):
    engine = SlowEngine(fail_after=2)
    pool = ContextPool(engine, size=4)
    results = call_from_threads(pool, 6)
    assert [r[0] for r in results] == [2.0 * i for i in range(6)]
    assert len(pool) == 2 and pool.size == 2 and engine.peak == 2
    assert "no further execution context" in caplog.text


def test_the_profiler_reaches_every_context():
    pool = ContextPool(SlowEngine(), size=2)
    call_from_threads(pool, 2)
    pool.profiler = profiler = object()
    assert all(c.profiler is profiler for c in pool._all)


@pytest.mark.parametrize("value, want", [("2", 2), ("0", 1), ("many", 4)])
def test_pool_size_from_the_environment(monkeypatch, value, want):
    monkeypatch.setenv(CONTEXTS_ENV, value)
    assert contexts_per_engine() == want


def test_eight_threads_on_a_real_engine_give_the_single_caller_answers():
    rng = np.random.default_rng(0)
    net = Network("mlp")
    x = net.add_input("x", np.float32, (4, 16))
    w = rng.standard_normal((16, 8)).astype(np.float32)
    y = net.add_layer("MatrixMultiply", [x, net.add_constant(w)], {}).outputs[0]
    net.mark_output(net.add_layer("Activation", [y], {"type": "tanh"}).outputs[0])
    engine = Builder(BuilderConfig(backend="numpy")).build_engine(net)
    pool = ContextPool(engine, size=4)
    inputs = [rng.standard_normal((4, 16)).astype(np.float32) for _ in range(8)]
    want = [np.tanh(a @ w) for a in inputs]
    got = [None] * 8

    def call(i):
        for _ in range(20):
            got[i] = pool.execute_v2([inputs[i]])[0]
    threads = [threading.Thread(target=call, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for g, w_ in zip(got, want):
        np.testing.assert_allclose(g, w_, rtol=1e-5, atol=1e-6)
    assert 1 <= len(pool) <= 4


def test_outputs_land_in_the_callers_buffers():
    net = Network("double")
    x = net.add_input("x", np.float32, (2, 3))
    net.mark_output(net.add_layer("ElementWise", [x, x], {"op": "sum"}).outputs[0])
    pool = ContextPool(Builder(BuilderConfig(backend="numpy")).build_engine(net))
    buffers = {}

    def allocate(index, shape):
        buffers[index] = np.empty(shape, np.float32)
        return buffers[index]
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    (out,) = pool.execute_v2([a], allocate)
    assert out is buffers[0]
    np.testing.assert_array_equal(out, a * 2)


# --- native replays (engine.replay) --------------------------------------------------------------

class ReplayingEngine(SlowEngine):
    """Contexts that offer a replay each (or raise when `fail` says so)."""

    def __init__(self, fail=False):
        super().__init__()
        self.fail = fail

    def create_execution_context(self):
        from tftrt_py.engine.replay import Functions, Replay

        context = super().create_execution_context()
        context.replays = True
        fail = self.fail

        def native_replay(inputs, out_dtypes):
            if fail:
                raise MemoryError("out of GPU memory (simulated)")
            return Replay(Functions(1, 2, 3, 4, 5, 6, 7), 1, 1, 1, [], [], keep=context)
        context.native_replay = native_replay
        return context


def test_exports_fresh_contexts_up_to_the_pool_size_per_input_shapes():
    engine = ReplayingEngine()
    pool = ContextPool(engine, size=2)
    a, b = [np.ones((4, 3), np.float32)], [np.ones((2, 3), np.float32)]
    replays = [pool.export(a, [np.float32]) for _ in range(3)]
    assert replays[0] is not None and replays[1] is not None and replays[2] is None
    assert all(r.limit == 2 and r.keep is not None for r in replays[:2])
    assert pool.export(b, [np.float32]) is not None  # other shapes count on their own
    assert engine.made == 3 and len(pool) == 0  # the idle first context went first; exported ones leave the pool
    np.testing.assert_array_equal(pool.execute_v2(a)[0], 2 * a[0])  # Python's calls get a context of their own
    assert engine.made == 4 and len(pool) == 1


def test_a_revoked_or_dropped_replay_frees_its_place():
    pool = ContextPool(ReplayingEngine(), size=1)
    a = [np.ones((4, 3), np.float32)]
    first = pool.export(a, [np.float32])
    first.revoke()
    second = pool.export(a, [np.float32])
    assert second is not None and pool.export(a, [np.float32]) is None
    del second
    assert pool.export(a, [np.float32]) is not None


def test_no_replay_where_the_backend_offers_none_or_a_context_cannot_be_made(caplog):
    assert ContextPool(SlowEngine()).export([np.ones(3, np.float32)], [np.float32]) is None
    pool = ContextPool(ReplayingEngine(fail=True), size=2)
    assert pool.export([np.ones(3, np.float32)], [np.float32]) is None
    assert "no native replay" in caplog.text and len(pool) == 1  # the context taken for it came back


def test_an_engine_that_cannot_be_replayed_stops_the_exports():
    engine = ReplayingEngine()
    pool = ContextPool(engine, size=2)
    pool._all[0].native_replay = lambda inputs, out_dtypes: None  # e.g. a TopK splits its CUDA graph
    assert pool.export([np.ones(3, np.float32)], [np.float32]) is None
    assert not pool.replays and len(pool) == 1 and engine.made == 1
