"""Device inputs of a captured engine (backends/cupy/runner.py): an array passed at the address the call before
passed too is read where it is, by a graph captured for that address (as TensorRT reads the buffers it is given);
a new address each call, an output of the engine fed back and a smaller batch are copied into the binding buffers
first. Every way answers for what the array holds when the run starts, as the numpy backend does."""
import numpy as np
import pytest

from tftrt_py.engine import Engine
from tftrt_py.engine.backends.cupy import runner as runner_module

from gpu_helpers import GPU, cupy_engine, healthy_gpu, tanh_dense  # noqa: F401 (autouse fixture)

pytestmark = GPU

N, K = 64, 128
fc = tanh_dense(N, K)


@pytest.fixture
def model():
    """A fresh context of a captured FP32 engine (one CUDA graph) and the numpy backend's answer."""
    ref = Engine(fc(), backend="numpy").create_execution_context()
    ctx = cupy_engine(fc()).create_execution_context()
    return ctx, lambda x: ref.execute({"x0": x})["y0"]


def image(seed):
    return np.random.default_rng(seed).standard_normal((N, K)).astype(np.float32)


def bound(ctx):
    return ctx._runner._bound


def test_an_array_passed_again_is_read_where_it_is_with_what_it_holds(model):
    import cupy

    ctx, ref = model
    x = cupy.empty((N, K), np.float32)
    for seed in range(5):  # capture, replay, then a graph bound to x's address
        x[...] = cupy.asarray(image(seed))
        np.testing.assert_allclose(cupy.asnumpy(ctx.execute({"x0": x})["y0"]), ref(image(seed)), rtol=1e-4,
                                   atol=1e-4, err_msg=f"call {seed}")
    assert list(bound(ctx)) == [(x.data.ptr,)]


def test_a_caller_cycling_through_buffers_keeps_a_graph_for_each_up_to_the_limit(model, monkeypatch):
    import cupy

    monkeypatch.setattr(runner_module, "BOUND_GRAPHS", 2)
    ctx, ref = model
    xs = [cupy.asarray(image(seed)) for seed in range(3)]
    for _ in range(2):
        for seed, x in enumerate(xs):
            for _ in range(3):  # a buffer passed three times in a row
                got = ctx.execute({"x0": x})["y0"]
                np.testing.assert_allclose(cupy.asnumpy(got), ref(image(seed)), rtol=1e-4, atol=1e-4)
    assert list(bound(ctx)) == [(xs[1].data.ptr,), (xs[2].data.ptr,)]


def test_a_new_array_each_call_is_copied_and_nothing_is_captured_for_it(model):
    import cupy

    ctx, ref = model
    keep = []
    for seed in range(4):
        x = cupy.asarray(image(seed))
        keep.append(x)  # alive: each call a new address
        np.testing.assert_allclose(cupy.asnumpy(ctx.execute({"x0": x})["y0"]), ref(image(seed)), rtol=1e-4,
                                   atol=1e-4)
    assert not bound(ctx)


def test_an_output_fed_back_is_copied_before_the_run_overwrites_it():
    """y = tanh(x W) with a square W: each call's output is the next call's input, the same buffer every time."""
    import cupy

    ref = Engine(fc(), backend="numpy").create_execution_context()
    ctx = cupy_engine(fc()).create_execution_context()
    x = image(7)
    y = ctx.execute({"x0": cupy.asarray(x)})["y0"]
    want = ref.execute({"x0": x})["y0"]
    for step in range(4):
        y = ctx.execute({"x0": y})["y0"]
        want = ref.execute({"x0": want})["y0"]
        np.testing.assert_allclose(cupy.asnumpy(y), want, rtol=1e-4, atol=1e-4, err_msg=f"step {step}")
    assert not bound(ctx)


def test_a_strided_view_is_copied(model):
    import cupy

    ctx, ref = model
    wide = cupy.asarray(np.concatenate([image(8), image(9)], axis=1))
    x = wide[:, :K]  # not contiguous
    for _ in range(3):
        np.testing.assert_allclose(cupy.asnumpy(ctx.execute({"x0": x})["y0"]), ref(image(8)), rtol=1e-4, atol=1e-4)
    assert not bound(ctx)
