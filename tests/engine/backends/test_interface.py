"""Backends declare what they run through the backend interface (backends/base.py)."""
import pytest

from tftrt_py.engine import Builder, BuilderConfig, Network, layers
from tftrt_py.engine.backends import get_backend
from tftrt_py.engine.backends import onnxruntime as ort_backend
from tftrt_py.engine.backends.base import Backend, Runner
from tftrt_py.engine.types import PRECISIONS

CPU_BACKENDS = ["numpy"] + (["onnxruntime"] if ort_backend.available()[0] else [])


@pytest.mark.parametrize("name", CPU_BACKENDS)
def test_cpu_backends_declare_every_layer_kind(name):
    backend = get_backend(name)
    assert isinstance(backend, Backend) and backend.name == name
    assert set(layers.kinds()) <= set(backend.kinds)
    assert set(backend.precisions) <= set(PRECISIONS)


@pytest.mark.parametrize("name", CPU_BACKENDS)
def test_contexts_run_through_a_runner(name):
    net = Network("one")
    x = net.add_input("x", "float32", (2, 3))
    net.mark_output(net.add_layer("Activation", [x], {"type": "relu"}).outputs[0])
    ctx = Builder(BuilderConfig(backend=name)).build_engine(net).create_execution_context()
    assert isinstance(ctx._runner, Runner)


@pytest.mark.parametrize("name", CPU_BACKENDS)
def test_host_backends_do_not_calibrate_on_a_device(name):
    """INT8 calibration records through ONNX Runtime's sessions for them: arrays stay the host's, and asking for
    device statistics says which backend has none."""
    import numpy as np

    from tftrt_py.engine.errors import BackendError

    backend, a = get_backend(name), np.ones(3, np.float32)
    assert backend.calibrates is False
    assert backend.to_device(a) is a and backend.to_host(a) is a
    with pytest.raises(BackendError, match=f"backend '{name}' does not calibrate on a device"):
        backend.finite_abs_max(a)
