"""The batch scheduler: requests merge, pad to allowed sizes, split back row for row; timeouts flush; a full
queue refuses; incompatible requests never merge; errors reach every request and the threads go on; callers
awaiting on an event loop get a batch's answers in one wake-up of it."""
import asyncio
import threading
import time
import weakref

import numpy as np
import pytest

from support import random_array
from tftrt_py.serving.batching import BatchScheduler
from tftrt_py.serving.config import BatchingOptions
from tftrt_py.serving.errors import Code, ServingError


class Model:
    """y = 3x + row index within the batch run (so a row served from the wrong place shows); records batches."""

    def __init__(self, gate=None):
        self.batches, self.gate = [], gate

    def __call__(self, arrays):
        if self.gate is not None:
            self.gate.wait()
        x = arrays["x"]
        self.batches.append(x.copy())
        return {"y": 3 * x, "n": np.arange(len(x))}


def scheduler(**options):
    seen = []
    defaults = dict(max_batch_size=8, batch_timeout_micros=200_000, num_batch_threads=1)
    sched = BatchScheduler(BatchingOptions(**{**defaults, **options}),
                           on_batch=lambda label, rows, padded: seen.append((label, rows, padded)))
    return sched, seen



def assert_rows_answered_in_order(inputs, results):
    """Each request got 3 x its rows, and its rows' places in the one batch (the model's "n" output)."""
    start = 0
    for x, out in zip(inputs, results):
        np.testing.assert_array_equal(out["y"], 3 * x)
        np.testing.assert_array_equal(out["n"], np.arange(start, start + len(x)))
        start += len(x)

def test_requests_merge_and_split_back_exactly():
    model, (sched, seen) = Model(), scheduler(allowed_batch_sizes=(4, 8))
    try:
        inputs = [random_array((n, 5)) for n in (1, 3, 2, 2)]  # 8 rows: one full batch, run at once
        futures = [sched.submit("q", model, {"x": x}, "m") for x in inputs]
        results = [f.result(timeout=10) for f in futures]
    finally:
        sched.stop()
    assert seen == [("m", 8, 8)] and len(model.batches) == 1
    assert_rows_answered_in_order(inputs, results)


def test_merged_batch_is_padded_to_the_next_allowed_size_with_its_first_row():
    model, (sched, seen) = Model(), scheduler(allowed_batch_sizes=(4, 8), batch_timeout_micros=20_000)
    try:
        a, b = random_array((2, 5)), random_array((3, 5))
        fa, fb = sched.submit("q", model, {"x": a}), sched.submit("q", model, {"x": b})
        ra, rb = fa.result(timeout=10), fb.result(timeout=10)
    finally:
        sched.stop()
    (ran,) = model.batches
    assert ran.shape == (8, 5) and [s[1:] for s in seen] == [(5, 8)]
    np.testing.assert_array_equal(ran[:5], np.concatenate([a, b]))
    np.testing.assert_array_equal(ran[5:], np.repeat(a[:1], 3, axis=0))
    np.testing.assert_array_equal(ra["y"], 3 * a)
    np.testing.assert_array_equal(rb["y"], 3 * b)
    assert rb["y"].shape == (3, 5)  # padding rows never reach a request


def test_timeout_flushes_a_partial_batch():
    model, (sched, seen) = Model(), scheduler(batch_timeout_micros=300_000)
    try:
        x = random_array((1, 5))
        start = time.monotonic()
        future = sched.submit("q", model, {"x": x})
        time.sleep(0.1)
        assert not future.done()  # waiting for more requests
        out = future.result(timeout=10)
        waited = time.monotonic() - start
    finally:
        sched.stop()
    assert 0.25 <= waited < 5 and [s[1:] for s in seen] == [(1, 1)]
    np.testing.assert_array_equal(out["y"], 3 * x)


def test_a_queue_keeps_no_run_function_once_its_batches_are_taken():
    """An unloaded model version leaves nothing behind in the scheduler."""
    model, (sched, _) = Model(), scheduler(batch_timeout_micros=1000)
    try:
        x = random_array((2, 5))
        np.testing.assert_array_equal(sched.submit("q", model, {"x": x}).result(timeout=10)["y"], 3 * x)
        gone = weakref.ref(model)
        del model
        deadline = time.monotonic() + 10
        while gone() is not None and time.monotonic() < deadline:  # the batch thread lets go after answering
            time.sleep(0.01)
        assert gone() is None
        np.testing.assert_array_equal(sched.submit("q", Model(), {"x": x}).result(timeout=10)["y"], 3 * x)
    finally:
        sched.stop()


def test_full_queue_refuses_with_unavailable_and_recovers():
    gate = threading.Event()
    model, (sched, _) = Model(gate), scheduler(max_batch_size=2, max_enqueued_batches=2, batch_timeout_micros=0)
    try:
        first = sched.submit("q", model, {"x": random_array((2, 5))})  # taken by the thread, blocked in the gate
        deadline = time.monotonic() + 5
        while sched.queue_depths().get("", 0) and time.monotonic() < deadline:
            time.sleep(0.01)
        queued = [sched.submit("q", model, {"x": random_array((2, 5))}) for _ in range(2)]  # 2 batches: full
        assert sched.queue_depths() == {"": 2}
        with pytest.raises(ServingError) as info:
            sched.submit("q", model, {"x": random_array((1, 5))})
        assert info.value.code is Code.UNAVAILABLE and "full" in info.value.message
        gate.set()
        for future in [first, *queued]:
            assert future.result(timeout=10)["y"].shape == (2, 5)
        x = random_array((1, 5))
        np.testing.assert_array_equal(sched.submit("q", model, {"x": x}).result(timeout=10)["y"], 3 * x)
    finally:
        gate.set()
        sched.stop()


def test_requests_with_other_dtypes_or_dims_do_not_merge():
    model, (sched, seen) = Model(), scheduler(batch_timeout_micros=50_000)
    try:
        feeds = [random_array((2, 5)), random_array((2, 6)), random_array((1, 5), "float64"), random_array((1, 5))]
        futures = [sched.submit("q", model, {"x": x}) for x in feeds]
        for x, future in zip(feeds, futures):
            np.testing.assert_array_equal(future.result(timeout=10)["y"], 3 * x)
    finally:
        sched.stop()
    assert sorted(b.shape + (b.dtype.name,) for b in model.batches) == [
        (1, 5, "float64"), (2, 6, "float32"), (3, 5, "float32")]


def test_a_requests_rows_are_its_batchs_from_its_submit_on():
    """Submit copies the rows into the batch: the caller's arrays may change (or go) while the batch waits."""
    model, (sched, _) = Model(), scheduler(batch_timeout_micros=50_000)
    try:
        x = random_array((2, 5))
        sent = x.copy()
        future = sched.submit("q", model, {"x": x})
        x[...] = -1
        np.testing.assert_array_equal(future.result(timeout=10)["y"], 3 * sent)
    finally:
        sched.stop()


def test_the_model_reads_each_input_as_one_aligned_contiguous_array():
    """What TensorFlow reads in place (models.eager_tensor): no copy of the batch on the batch thread."""
    seen = []

    def run(arrays):
        seen.extend((a.shape, a.flags.c_contiguous, a.ctypes.data % 64) for a in arrays.values())
        return {"y": arrays["x"] + arrays["z"][:, :1]}

    sched, _ = scheduler(max_batch_size=4, allowed_batch_sizes=(4,))
    try:
        x, z = random_array((3, 5)), random_array((3, 2))
        np.testing.assert_array_equal(sched.submit("q", run, {"x": x, "z": z}).result(timeout=10)["y"],
                                      x + z[:, :1])
    finally:
        sched.stop()
    assert sorted(seen) == [((4, 2), True, 0), ((4, 5), True, 0)]


def test_answers_stay_right_when_the_model_returns_views_of_its_inputs():
    """Batches reuse their input arrays: an output viewing them is copied before the next batch fills them."""
    def identity(arrays):
        return {"y": arrays["x"], "first": arrays["x"][:, :1]}

    sched, _ = scheduler(max_batch_size=2, batch_timeout_micros=0)
    try:
        inputs = [random_array((1, 5)) for _ in range(8)]
        results = [sched.submit("q", identity, {"x": x}).result(timeout=10) for x in inputs]
    finally:
        sched.stop()
    for x, out in zip(inputs, results):  # checked once every batch ran
        np.testing.assert_array_equal(out["y"], x)
        np.testing.assert_array_equal(out["first"], x[:, :1])


def test_bad_requests_are_refused_at_submit():
    model, (sched, _) = Model(), scheduler(max_batch_size=4)
    try:
        cases = [{"x": random_array((5, 2))}, {"x": random_array((2, 2)), "z": random_array((3, 2))},
                 {"x": np.float32(1.5)}, {"x": random_array((0, 2))}]
        for arrays in cases:
            with pytest.raises(ServingError) as info:
                sched.submit("q", model, arrays)
            assert info.value.code is Code.INVALID_ARGUMENT
    finally:
        sched.stop()
    assert model.batches == []


def test_a_failing_batch_fails_each_request_and_the_threads_go_on():
    calls = []

    def flaky(arrays):
        calls.append(len(arrays["x"]))
        if len(calls) == 1:
            raise RuntimeError("engine exploded")
        return {"y": arrays["x"] * 2, "bad": np.ones(1)} if len(calls) == 2 else {"y": arrays["x"] * 2}

    sched, _ = scheduler(batch_timeout_micros=0)
    try:
        with pytest.raises(ServingError) as info:
            sched.submit("q", flaky, {"x": random_array((2, 3))}).result(timeout=10)
        assert info.value.code is Code.INTERNAL and "engine exploded" in info.value.message
        with pytest.raises(ServingError) as info:  # an output without the batch dimension cannot be split
            sched.submit("q", flaky, {"x": random_array((2, 3))}).result(timeout=10)
        assert info.value.code is Code.FAILED_PRECONDITION
        x = random_array((2, 3))
        np.testing.assert_array_equal(sched.submit("q", flaky, {"x": x}).result(timeout=10)["y"], 2 * x)
    finally:
        sched.stop()


def test_stop_fails_queued_requests_with_unavailable():
    sched, _ = scheduler(batch_timeout_micros=60_000_000)
    future = sched.submit("q", Model(), {"x": random_array((1, 5))})
    sched.stop()
    with pytest.raises(ServingError) as info:
        future.result(timeout=10)
    assert info.value.code is Code.UNAVAILABLE


class CountingLoop(asyncio.SelectorEventLoop):
    """An event loop counting the callbacks other threads schedule on it (each one wakes it)."""

    def __init__(self):
        super().__init__()
        self.wakeups, self.errors = 0, []
        self.set_exception_handler(lambda loop, context: self.errors.append(context))

    def call_soon_threadsafe(self, *args, **kwargs):
        self.wakeups += 1
        return super().call_soon_threadsafe(*args, **kwargs)


def run_on_loop(coroutine_fn):
    loop = CountingLoop()
    try:
        return loop, loop.run_until_complete(coroutine_fn(loop))
    finally:
        loop.close()


def test_a_batch_answers_the_requests_awaiting_on_one_loop_with_one_wake_up():
    model, (sched, seen) = Model(), scheduler(max_batch_size=8)
    inputs = [random_array((n, 5)) for n in (1, 3, 2, 2)]

    async def requests(loop):
        futures = [sched.submit("q", model, {"x": x}, "m", loop=loop) for x in inputs]
        return await asyncio.wait_for(asyncio.gather(*futures), 30)
    try:
        loop, results = run_on_loop(requests)
    finally:
        sched.stop()
    assert seen == [("m", 8, 8)] and loop.wakeups == 1 and loop.errors == []
    assert_rows_answered_in_order(inputs, results)


def test_a_cancelled_request_leaves_the_others_of_its_batch_answered():
    gate = threading.Event()
    model, (sched, _) = Model(gate), scheduler(max_batch_size=3)
    inputs = [random_array((1, 5)) for _ in range(3)]

    async def requests(loop):
        futures = [sched.submit("q", model, {"x": x}, loop=loop) for x in inputs]
        futures[1].cancel()  # its caller went away while the batch waits to run
        gate.set()
        return await asyncio.wait_for(asyncio.gather(futures[0], futures[2]), 30)
    try:
        loop, results = run_on_loop(requests)
    finally:
        gate.set()
        sched.stop()
    assert loop.errors == [] and len(model.batches) == 1 and len(model.batches[0]) == 3
    np.testing.assert_array_equal(results[0]["y"], 3 * inputs[0])
    np.testing.assert_array_equal(results[1]["y"], 3 * inputs[2])


def test_a_failing_batch_fails_each_request_awaiting_on_a_loop():
    def failing(arrays):
        raise RuntimeError("engine exploded")

    sched, _ = scheduler(max_batch_size=2)

    async def requests(loop):
        futures = [sched.submit("q", failing, {"x": random_array((1, 3))}, loop=loop) for _ in range(2)]
        return await asyncio.gather(*futures, return_exceptions=True)
    try:
        loop, errors = run_on_loop(requests)
    finally:
        sched.stop()
    assert loop.wakeups == 1
    assert [(type(e), e.code) for e in errors] == [(ServingError, Code.INTERNAL)] * 2
    assert all("engine exploded" in e.message for e in errors)


def test_stop_fails_requests_queued_from_a_loop_with_unavailable():
    sched, _ = scheduler(batch_timeout_micros=60_000_000)

    async def request(loop):
        future = sched.submit("q", Model(), {"x": random_array((1, 5))}, loop=loop)
        await loop.run_in_executor(None, sched.stop)
        with pytest.raises(ServingError) as info:
            await future
        return info.value.code
    loop, code = run_on_loop(request)
    assert code is Code.UNAVAILABLE and loop.errors == []
