"""What a quantized MatrixMultiply reads (cupy program.quant_plan), without a GPU: constant weights quantized per
output column once per format and layout while they live, shared read-only by every plan a build asks for."""
import numpy as np
import pytest

from tftrt_py.engine import Network
from tftrt_py.engine.backends.cupy.ops import fp8
from tftrt_py.engine.backends.cupy.ops.int8 import matmul_constant
from tftrt_py.engine.backends.cupy.quant_planning import quant_plan


def dense(k=64, n=48):
    net = Network("m")
    x = net.add_input("x", "float16", (32, k))
    x.dynamic_range = 2.0
    w = net.add_constant(np.random.default_rng(0).standard_normal((k, n)).astype(np.float32), name="w")
    return net.add_layer("MatrixMultiply", [x, w], {}, name="mm")


@pytest.mark.parametrize("fmt, quantize", [("INT8", matmul_constant), ("FP8", fp8.matmul_constant)])
def test_weights_are_quantized_once_per_format_and_shared_read_only(fmt, quantize):
    layer = dense()
    first, again = quant_plan(layer, fmt)[1], quant_plan(layer, fmt)[1]
    assert again["b"]["const"] is first["b"]["const"]
    q, s = quantize(layer.inputs[1].producer.weights["value"], "b", False, first["kp"])
    np.testing.assert_array_equal(first["b"]["const"], q)
    np.testing.assert_array_equal(first["dq"], s * np.float32(2.0 / (127 if fmt == "INT8" else 448)))
    with pytest.raises(ValueError, match="read-only"):
        first["b"]["const"][0, 0] = 1
    other = quant_plan(layer, "FP8" if fmt == "INT8" else "INT8")[1]
    assert other["b"]["const"] is not first["b"]["const"]


def test_new_weights_are_quantized_anew():
    layer = dense()
    before = quant_plan(layer, "INT8")[1]["b"]["const"]
    producer = layer.inputs[1].producer
    producer.weights["value"] = -producer.weights["value"]
    np.testing.assert_array_equal(quant_plan(layer, "INT8")[1]["b"]["const"], -before)


def test_every_operand_is_quantized_in_a_layout_the_quantize_step_writes():
    """Attention's q, k, v as they are; a product's operands K-contiguous (the b operand transposed unless it is
    already [N, K]); see tests/engine/test_conv_fold.py for a stem's folded image."""
    from tftrt_py.engine.backends.cupy.ops.quant import ROWS, TRANSPOSED

    net = Network("layouts")
    q, k, v = (net.add_input(name, "float16", (2, 4, 8, 16)) for name in "qkv")
    for t in (q, k, v):
        t.dynamic_range = 1.0
    attention = net.add_layer("Attention", [q, k, v], dict(scale=0.25), name="attention")
    assert [o[3] for o in quant_plan(attention, "INT8")[0]] == [ROWS] * 3
    a, b = net.add_input("a", "float16", (8, 16)), net.add_input("b", "float16", (16, 16))
    a.dynamic_range = b.dynamic_range = 1.0
    for transpose_b, layout in ((False, TRANSPOSED), (True, ROWS)):
        mm = net.add_layer("MatrixMultiply", [a, b], {"transpose_b": transpose_b}, name=f"mm{transpose_b}")
        assert [o[3] for o in quant_plan(mm, "FP8")[0]] == [ROWS, layout]
