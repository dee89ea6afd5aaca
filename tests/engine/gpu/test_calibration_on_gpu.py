"""INT8 calibration on the GPU: an op whose engines the cupy backend builds calibrates there, the FP32 network as one
engine with every float tensor an output, each tensor binned on the device. Device histograms count exactly as
host ones do (the same float32 arithmetic, NaN and Inf left out), and the ranges and outputs equal those of ONNX
Runtime's host sessions within FP32 rounding."""
import numpy as np
import pytest

from tftrt_py.calibration.calibrators import Histogram
from tftrt_py.calibration.collector import CalibrationEngine, Collector, EngineRecording
from tftrt_py.engine import Network
from tftrt_py.engine.backends import get_backend

from gpu_helpers import GPU, healthy_gpu  # noqa: F401 (autouse fixture)

pytestmark = GPU
cupy = pytest.importorskip("cupy")


def test_device_statistics_are_the_host_arithmetic():
    """The largest finite |x| and the bin counts (float32 |x| * scale, clamped to the last bin, truncated) of
    values the kernels meet: zeros of both signs, values past the range, the float32 maximum, NaN and inf."""
    gpu = get_backend("cupy")
    rng = np.random.default_rng(10)
    a = rng.standard_normal(1_000_003).astype(np.float32) * 5
    a[:8] = [0.0, -0.0, np.nan, np.inf, -np.inf, 3.4028235e38, -1e30, 1e-30]
    finite = np.abs(a[np.isfinite(a)])
    assert gpu.finite_abs_max(cupy.asarray(a)) == float(finite.max())
    assert gpu.finite_abs_max(cupy.asarray(np.array([np.nan, -np.inf], np.float32))) == -1.0
    for scale in (np.float32(2048 / 7.5), np.float32(2048 / 1e-3), np.float32(0.0)):
        with np.errstate(over="ignore"):  # past float32's range: inf, clamped to the last bin
            want = np.bincount(np.minimum(finite * scale, np.float32(2047)).astype(np.int64), minlength=2048)
        np.testing.assert_array_equal(gpu.bin_counts(cupy.asarray(a), scale, 2048), want)


def test_device_histograms_count_as_host_histograms_do_as_their_range_grows():
    gpu = get_backend("cupy")
    rng = np.random.default_rng(11)
    host, device = Histogram(), Histogram()
    for i in range(4):
        a = rng.standard_normal((8, 33, 17)).astype(np.float32) * (1 + i)
        a[0, 0, :3] = [np.nan, np.inf, -np.inf]
        a[1] = 0.0
        host.add(a)
        device.add(cupy.asarray(a), gpu)
        assert device.upper == host.upper and device.amax == host.amax
        np.testing.assert_array_equal(device.counts, host.counts)


def unfused_net(batch: int = 4) -> Network:
    """What a converted TF graph gives before fusion: convolution, bias add, ReLU, max pooling, a residual sum, the
    mean over H and W and a dense layer, each its own layer."""
    rng = np.random.default_rng(0)
    net = Network("unfused")
    x = net.add_input("input", "float32", (batch, 16, 16, 3))

    def conv(t, cin, cout):
        params = dict(strides=[1, 1], dilations=[1, 1], pre_padding=[1, 1], post_padding=[1, 1], groups=1)
        y = net.add_layer("Convolution", [t], params,
                          {"kernel": rng.standard_normal((3, 3, cin, cout)).astype("float32") * 0.3}).outputs[0]
        bias = net.add_constant(rng.standard_normal(cout).astype("float32"), name="bias")
        return net.add_layer("ElementWise", [y, bias], dict(op="sum")).outputs[0]

    y = net.add_layer("Activation", [conv(x, 3, 16)], dict(type="relu")).outputs[0]
    y = net.add_layer("Pooling", [y], dict(type="max", window=[2, 2], strides=[2, 2], pre_padding=[0, 0],
                                           post_padding=[0, 0])).outputs[0]
    z = net.add_layer("ElementWise", [conv(y, 16, 16), y], dict(op="sum")).outputs[0]
    z = net.add_layer("Activation", [z], dict(type="relu")).outputs[0]
    z = net.add_layer("Reduce", [z], dict(op="mean", axes=[1, 2], keep_dims=False)).outputs[0]
    w = net.add_constant(rng.standard_normal((16, 10)).astype("float32"), name="fc.weight")
    net.mark_output(net.add_layer("MatrixMultiply", [z, w], {}).outputs[0], name="logits")
    return net


@pytest.mark.parametrize("algorithm, rtol", [("minmax", 1e-5), ("entropy", 1e-2)])
def test_the_cupy_backend_calibrates_on_the_gpu_as_onnx_runtime_does_on_the_host(algorithm, rtol):
    """The same ranges (entropy within a bin of 2048 at the threshold: FP32 sums round differently there) and
    outputs; every float tensor of the network has a range."""
    rng = np.random.default_rng(12)
    batches = [rng.standard_normal((4, 16, 16, 3)).astype(np.float32) * (1 + i) for i in range(3)]
    results = []
    for backend in ("cupy", None):
        engine, collector = CalibrationEngine(unfused_net(), backend=backend), Collector(algorithm)
        outs = [engine.execute([x], collector) for x in batches]
        results.append((engine, outs, collector.ranges()))
    (gpu, gpu_outs, gpu_ranges), (host, host_outs, host_ranges) = results
    assert [type(step) for step in gpu._steps] == [EngineRecording]
    assert {type(step).__name__ for step in host._steps} == {"_Session"}
    floats = [t.name for t in gpu.network.inputs] + [t.name for layer in gpu.network.layers
                                                     if layer.kind != "Constant" for t in layer.outputs]
    assert sorted(gpu_ranges) == sorted(host_ranges) == sorted(floats)
    for name in gpu_ranges:
        np.testing.assert_allclose(gpu_ranges[name], host_ranges[name], rtol=rtol, err_msg=name)
    for got, want in zip(gpu_outs, host_outs):
        assert isinstance(got[0], np.ndarray)
        np.testing.assert_allclose(got[0], want[0], rtol=1e-4, atol=1e-4)
