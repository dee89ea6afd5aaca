"""The collector bins tensors in a thread of its own while the calibration engine computes: the histograms it
ends with are those binning each tensor in observation order gives, and a failure in binning reaches the caller.
The calibration engine computes on ONNX Runtime where it runs, as the numpy backend would."""
import numpy as np
import pytest

from tftrt_py.calibration.calibrators import Histogram
from tftrt_py.calibration.collector import Collector


def test_binning_in_the_background_gives_the_histograms_of_binning_in_observation_order():
    rng = np.random.default_rng(3)
    batches = [(f"t{i % 3}", rng.standard_normal(10_000).astype(np.float32) * (1 + i)) for i in range(12)]
    collector = Collector("entropy")
    for name, value in batches:  # each tensor's range grows batch by batch: counts depend on the order
        collector.observe(name, value)
    expected = {}
    for name, value in batches:
        expected.setdefault(name, Histogram()).add(value)
    ranges = collector.ranges()
    assert sorted(ranges) == ["t0", "t1", "t2"]
    for name, histogram in expected.items():
        got = collector.histograms[name]
        assert got.upper == histogram.upper and got.amax == histogram.amax
        np.testing.assert_array_equal(got.counts, histogram.counts)
        assert ranges[name] == collector.calibrator.amax(histogram)


def test_integer_tensors_are_not_binned():
    collector = Collector()
    collector.observe("ids", np.arange(10, dtype=np.int32))
    assert collector.ranges() == {}


def test_a_binning_failure_is_raised_to_the_caller():
    collector = Collector()
    collector.observe("x", np.ones(4, np.float32))
    collector.ranges()  # waits for that binning
    collector.histograms["x"].add = None  # the next binning of x fails
    collector.observe("x", np.ones(4, np.float32))
    with pytest.raises(TypeError):
        collector.ranges()


def test_the_calibration_engine_records_every_tensor_with_onnx_runtime_as_the_numpy_backend_does(monkeypatch):
    """ONNX Runtime computes the FP32 network (sessions returning every tensor they compute); its outputs and the
    ranges calibrated from them are the numpy backend's within float32 rounding."""
    from networks import conv_relu_pool_net

    from tftrt_py.calibration import collector as collecting
    from tftrt_py.calibration.collector import CalibrationEngine

    rng = np.random.default_rng(5)
    batches = [rng.standard_normal((4, 8, 8, 3)).astype(np.float32) for _ in range(2)]

    def calibrate():
        engine, found = CalibrationEngine(conv_relu_pool_net()), Collector("entropy")
        outs = [engine.execute([x], found) for x in batches]
        return engine, outs, found.ranges()

    engine, outs, ranges = calibrate()
    assert {type(step).__name__ for step in engine._steps} == {"_Session"}
    def missing(name):
        raise ImportError(f"no {name} here")

    monkeypatch.setattr(collecting, "get_backend", missing)
    reference, want, want_ranges = calibrate()
    assert {type(step).__name__ for step in reference._steps} == {"LayerStep"}
    assert sorted(ranges) == sorted(want_ranges) and len(ranges) == 4  # the input and each layer's output
    for name in ranges:
        np.testing.assert_allclose(ranges[name], want_ranges[name], rtol=1e-5)
    for got, ref in zip(outs, want):
        np.testing.assert_allclose(got[0], ref[0], rtol=1e-5, atol=1e-6)


def _calibrated(engine, batches):
    collector = Collector("entropy")
    outs = [engine.execute([x], collector) for x in batches]
    return outs, collector.ranges()


def test_a_backend_that_calibrates_on_its_device_records_every_tensor_as_one_engine(monkeypatch):
    """A backend that calibrates where it computes (the GPU's) runs the FP32 network as one engine whose every
    float tensor is an output; the ranges and outputs equal those of ONNX Runtime's sessions. The numpy backend
    stands in for the device here."""
    from networks import conv_relu_pool_net

    from tftrt_py.calibration.collector import CalibrationEngine, EngineRecording
    from tftrt_py.engine.backends.numpy_backend import NumpyBackend

    from test_calibrators import HostDevice

    rng = np.random.default_rng(6)
    batches = [rng.standard_normal((4, 8, 8, 3)).astype(np.float32) * (1 + i) for i in range(3)]
    want_outs, want = _calibrated(CalibrationEngine(conv_relu_pool_net()), batches)
    monkeypatch.setattr(NumpyBackend, "calibrates", True)
    monkeypatch.setattr(NumpyBackend, "finite_abs_max", staticmethod(HostDevice.finite_abs_max))
    monkeypatch.setattr(NumpyBackend, "bin_counts", staticmethod(HostDevice.bin_counts))
    engine = CalibrationEngine(conv_relu_pool_net(), backend="numpy")
    assert [type(step) for step in engine._steps] == [EngineRecording]
    outs, ranges = _calibrated(engine, batches)
    assert sorted(ranges) == sorted(want) and len(ranges) == 4
    for name in ranges:
        np.testing.assert_allclose(ranges[name], want[name], rtol=1e-5)
    for got, ref in zip(outs, want_outs):
        assert isinstance(got[0], np.ndarray)
        np.testing.assert_allclose(got[0], ref[0], rtol=1e-5, atol=1e-6)


def test_a_device_recording_over_its_share_of_memory_records_on_the_host(monkeypatch, caplog):
    """Every tensor of a device recording is held at once: over RECORDING_SHARE of the memory an engine may take,
    calibration runs on ONNX Runtime's sessions instead, and says so."""
    from networks import conv_relu_pool_net

    from tftrt_py.calibration.collector import CalibrationEngine
    from tftrt_py.engine.backends.numpy_backend import NumpyBackend

    monkeypatch.setattr(NumpyBackend, "calibrates", True)
    monkeypatch.setenv("TFTRT_PY_MAX_ENGINE_BYTES", "4096")
    with caplog.at_level("INFO", logger="tftrt_py.calibration.collector"):
        engine = CalibrationEngine(conv_relu_pool_net(), backend="numpy")
    assert {type(step).__name__ for step in engine._steps} == {"_Session"}
    assert "calibrating conv_net on the host, not on numpy" in caplog.text
    assert "TFTRT_PY_MAX_ENGINE_BYTES" in caplog.text


def test_host_backends_calibrate_on_onnx_runtime_sessions():
    from networks import conv_relu_pool_net

    from tftrt_py.calibration.collector import CalibrationEngine

    engine = CalibrationEngine(conv_relu_pool_net(), backend="onnxruntime")
    assert {type(step).__name__ for step in engine._steps} == {"_Session"}
