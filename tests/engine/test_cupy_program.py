"""What the cupy backend's program stores for an engine's constants, without a GPU (engine/backends/cupy/program.py):
each Constant as the program stores it, its storage dtype and contiguous, cast in threads when they are large, with
the values a cast on one thread gives."""
import numpy as np
import pytest

from tftrt_py.engine import Network
from tftrt_py.engine.backends import threads
from tftrt_py.engine.backends.cupy import program
from tftrt_py.engine.builder.precision import assign_precisions


def fp16_network() -> Network:
    net = Network("constants")
    x = net.add_input("x", "float32", (4, 64))
    weights = np.random.default_rng(0).standard_normal((64, 32)).astype("float32")
    w = net.add_constant(np.asfortranarray(weights), name="w")
    y = net.add_layer("MatrixMultiply", [x, w], {}, name="mm").outputs[0]
    index = net.add_constant(np.arange(4, dtype="int32"), name="index")
    net.mark_output(net.add_layer("Gather", [y, index], {"axis": 0}, name="gather").outputs[0])
    assign_precisions(net, "FP16")
    return net


@pytest.mark.parametrize("in_threads", [False, True])
def test_constants_are_stored_in_their_storage_dtype_contiguous(monkeypatch, in_threads):
    if in_threads:
        monkeypatch.setattr(threads, "PARALLEL_BYTES", 0)
        monkeypatch.setattr(threads, "cpu_threads", lambda: 2)
    net = fp16_network()
    stored = program._stored_constants(net, "FP16")
    w = next(l for l in net.layers if l.name == "w").weights["value"]
    assert stored["w"].dtype == np.float16 and stored["w"].flags.c_contiguous
    np.testing.assert_array_equal(stored["w"], w.astype(np.float16))
    assert stored["index"].dtype == np.int32 and np.array_equal(stored["index"], np.arange(4))
