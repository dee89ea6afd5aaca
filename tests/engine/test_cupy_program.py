"""What the cupy backend's program stores for an engine's constants, without a GPU (engine/backends/cupy/program.py):
each Constant in its storage dtype, contiguous (its upload is tests/engine/gpu's)."""
import numpy as np

from tftrt_py.engine import Network
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


def test_constants_are_stored_in_their_storage_dtype_contiguous():
    layers = {layer.name: layer for layer in fp16_network().layers}
    w, index = (program._stored(layers[name], "FP16") for name in ("w", "index"))
    assert w.dtype == np.float16 and w.flags.c_contiguous
    np.testing.assert_array_equal(w, layers["w"].weights["value"].astype(np.float16))
    assert index.dtype == np.int32 and np.array_equal(index, np.arange(4))


def test_a_constant_already_stored_as_its_dtype_is_not_copied():
    net = Network("n")
    value = np.arange(6, dtype="int32")
    net.add_constant(value, name="c")
    assert program._stored(net.layers[0], "FP16") is value
