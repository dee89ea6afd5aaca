"""Device arrays and streams (backends/cupy/runner.py): a captured engine replays on the caller's stream, after the
work that made its inputs and before the work that reads its outputs; a run on another stream, or a host run,
waits for the last run and for what read its outputs until then. Inputs arrive late and outputs are read late here
(kernels that spin first), so a run that did not wait would read stale inputs or overwrite unread outputs."""
import numpy as np
import pytest

from tftrt_py.engine import Engine

from gpu_helpers import GPU, cupy_engine, healthy_gpu, tanh_dense  # noqa: F401 (autouse fixture)

pytestmark = GPU

N, K = 256, 512
SPIN_CYCLES = 20_000_000  # ~10 ms at H100 clocks


@pytest.fixture(scope="module")
def late_copy():
    """late_copy(src, dst, spins=1): dst[:] = src on the current stream, after spinning spins x SPIN_CYCLES clocks."""
    import cupy

    kernel = cupy.RawKernel(r"""
    extern "C" __global__ void late_copy(const float* src, float* dst, int n, long long cycles) {
        long long start = clock64();
        while (clock64() - start < cycles) {}
        for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) dst[i] = src[i];
    }""", "late_copy")

    def run(src, dst, spins=1):
        kernel((64,), (256,), (src, dst, np.int32(src.size), np.int64(spins * SPIN_CYCLES)))

    return run


@pytest.fixture(scope="module")
def model():
    """A captured FP32 engine (one CUDA graph), its numpy reference and a context that has replayed once."""
    import cupy

    fc = tanh_dense(N, K)
    ref = Engine(fc(), backend="numpy").create_execution_context()
    ctx = cupy_engine(fc()).create_execution_context()
    for _ in range(2):  # the first run captures, the second replays
        ctx.execute({"x0": cupy.ones((N, K), np.float32)})
    cupy.cuda.Device().synchronize()
    return ctx, lambda x: ref.execute({"x0": x})["y0"]


def inputs(seed, count):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((N, K)).astype(np.float32) for _ in range(count)]


def test_replays_follow_late_inputs_on_the_callers_stream(model, late_copy):
    import cupy

    ctx, ref = model
    xs = inputs(1, 4)
    srcs = [cupy.asarray(x) for x in xs]
    dst = cupy.empty((N, K), np.float32)
    outs = []
    stream = cupy.cuda.Stream(non_blocking=True)
    cupy.cuda.Device().synchronize()
    with stream:
        for src in srcs:  # each input overwritten after the run that reads it: stream order keeps them apart
            late_copy(src, dst)
            outs.append(ctx.execute({"x0": dst})["y0"].copy())
    stream.synchronize()
    for x, out in zip(xs, outs):
        np.testing.assert_allclose(cupy.asnumpy(out), ref(x), rtol=1e-4, atol=1e-4)


def test_a_run_on_another_stream_waits_for_the_last_run_and_its_readers(model, late_copy):
    """Stream a's run (at ~1 spin) is read at ~3 spins; stream b's call, made after a's, would run at ~2 spins and
    overwrite the outputs a has not read yet, unless it waits for all a was given."""
    import cupy

    ctx, ref = model
    xs = inputs(2, 4)
    a, b = cupy.cuda.Stream(non_blocking=True), cupy.cuda.Stream(non_blocking=True)
    dst = {a: cupy.empty((N, K), np.float32), b: cupy.empty((N, K), np.float32)}
    got = [cupy.empty((N, K), np.float32) for _ in xs]
    cupy.cuda.Device().synchronize()
    for i, x in enumerate(xs):  # no host synchronisation between the calls
        stream = (a, b)[i % 2]
        with stream:
            late_copy(cupy.asarray(x), dst[stream], 1 if stream is a else 2)
            late_copy(ctx.execute({"x0": dst[stream]})["y0"], got[i], 2 if stream is a else 0)
    a.synchronize()
    b.synchronize()
    for i, x in enumerate(xs):
        np.testing.assert_allclose(cupy.asnumpy(got[i]), ref(x), rtol=1e-4, atol=1e-4, err_msg=f"run {i}")


def test_a_host_run_after_a_device_run_waits_for_its_readers(model, late_copy):
    import cupy

    ctx, ref = model
    (x_dev, x_host), stream = inputs(3, 2), cupy.cuda.Stream(non_blocking=True)
    dst, got = cupy.empty((N, K), np.float32), cupy.empty((N, K), np.float32)
    cupy.cuda.Device().synchronize()
    with stream:
        late_copy(cupy.asarray(x_dev), dst)
        late_copy(ctx.execute({"x0": dst})["y0"], got, 2)  # read at ~3 spins
    out_host = ctx.execute({"x0": x_host})["y0"]  # numpy in, numpy out, on the context's own stream
    stream.synchronize()
    np.testing.assert_allclose(out_host, ref(x_host), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(cupy.asnumpy(got), ref(x_dev), rtol=1e-4, atol=1e-4)
