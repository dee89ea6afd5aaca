"""A calibrating conversion starts loading the engine backend's libraries (and what its builds compile ahead in) on a
background thread while it loads the model: once per process, on the backend the engine ops will use; a failure
there is left for the engine ops to report. Another conversion starts only the GPU's driver and context there and
imports cupy, and only where engine ops may run on the GPU."""
import ctypes
import logging

import pytest

from tftrt_py.engine.backends.cupy import _device
from tftrt_py.engine_op import op


class Stub:
    def __init__(self, fail=False):
        self.fail, self.warmed = fail, []

    def warm_up(self, calibrating=False, timing_cache=None):
        self.warmed.append((calibrating, timing_cache))
        if self.fail:
            raise RuntimeError("no libraries here")


def test_the_backend_is_warmed_up_once_on_a_background_thread(monkeypatch):
    stub, asked = Stub(), []
    monkeypatch.setattr(op, "_warm_ups", {})
    monkeypatch.setattr(op, "get_backend", lambda name: asked.append(name) or stub)
    thread = op.warm_up_backend("the conversion's timing cache")
    assert op.warm_up_backend() is thread and thread.daemon
    thread.join(10)
    assert not thread.is_alive() and asked == [op.engine_backend()]
    assert stub.warmed == [(True, "the conversion's timing cache")]


def test_a_failing_warm_up_is_logged_not_raised(monkeypatch, caplog):
    monkeypatch.setattr(op, "_warm_ups", {})
    monkeypatch.setattr(op, "get_backend", lambda name: Stub(fail=True))
    with caplog.at_level(logging.DEBUG, logger=op.__name__):
        op.warm_up_backend().join(10)
    assert "no libraries here" in caplog.text


@pytest.mark.parametrize("driver, probed", [(True, 1), (False, 0)])
def test_the_gpu_driver_starts_once_on_a_background_thread_and_cupy_is_imported_where_it_did(monkeypatch, driver,
                                                                                           probed):
    started, probes = [], []
    monkeypatch.setattr(op, "_warm_ups", {})
    monkeypatch.setattr(op.cupy_backend, "start_driver", lambda: started.append(1) or driver)
    monkeypatch.setattr(op.cupy_backend, "available", lambda: probes.append(1))
    monkeypatch.delenv("TFTRT_PY_BACKEND", raising=False)
    thread = op.warm_up_device()
    assert op.warm_up_device() is thread and thread.daemon
    thread.join(10)
    assert started == [1] and len(probes) == probed


@pytest.mark.parametrize("backend", ["numpy", "onnxruntime"])
def test_the_gpu_is_left_alone_where_engines_run_on_the_cpu(monkeypatch, backend):
    started = []
    monkeypatch.setattr(op, "_warm_ups", {})
    monkeypatch.setattr(op.cupy_backend, "start_driver", lambda: started.append(1))
    monkeypatch.setenv("TFTRT_PY_BACKEND", backend)
    assert op.warm_up_device() is None and started == []


class FakeDriver:
    """libcuda: records its calls; `failing` names the one that returns an error."""

    def __init__(self, failing=None):
        self.calls, self.failing = [], failing
        for name in ("cuInit", "cuDeviceGet", "cuDevicePrimaryCtxRetain"):
            setattr(self, name, lambda *args, _name=name: self.calls.append(_name) or int(_name == failing))


def test_the_driver_is_initialized_and_the_first_device_s_context_retained(monkeypatch):
    lib = FakeDriver()
    monkeypatch.setattr(ctypes, "CDLL", lambda name: lib)
    assert _device.start_driver()
    assert lib.calls == ["cuInit", "cuDeviceGet", "cuDevicePrimaryCtxRetain"]


def test_without_a_driver_or_a_device_nothing_is_held(monkeypatch):
    def missing(name):
        raise OSError(f"{name}: cannot open shared object file")

    monkeypatch.setattr(ctypes, "CDLL", missing)
    assert not _device.start_driver()
    lib = FakeDriver(failing="cuInit")  # a driver without a device: CUDA_ERROR_NO_DEVICE
    monkeypatch.setattr(ctypes, "CDLL", lambda name: lib)
    assert not _device.start_driver()
    assert lib.calls == ["cuInit"]
