"""Without a usable GPU the cupy backend imports, says why it cannot run, and the CPU's is the default."""
import pytest

from tftrt_py.engine.backends import default_backend_name, get_backend
from tftrt_py.engine.backends.cupy import available
from tftrt_py.engine.backends.onnxruntime import available as onnxruntime_available
from tftrt_py.engine.errors import BackendError


def test_backend_package_imports_and_default_name():
    ok, why = available()
    assert default_backend_name() == ("cupy" if ok else "onnxruntime" if onnxruntime_available()[0] else "numpy")
    assert isinstance(why, str) and why


@pytest.mark.skipif(available()[0], reason="a GPU is usable here")
def test_cupy_backend_refuses_clearly_without_gpu():
    with pytest.raises(BackendError, match="no NVIDIA GPU / cupy not installed: using the numpy backend"):
        get_backend("cupy")
