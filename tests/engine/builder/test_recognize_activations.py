"""Swish and both GELU forms recognized in element-wise subgraphs (then fused like any activation)."""
import numpy as np
import pytest
import tensorflow as tf

from fusion_nets import add, build_and_compare, const, layer, layer_names, matmul, network, rand
from support import assert_converts


def swish(net, x):
    return add(net, "ElementWise", [x, add(net, "Activation", [x], "sigmoid", type="sigmoid")], "mul", op="prod")


def gelu_erf(net, x):
    half = add(net, "ElementWise", [const(net, 0.5, "half"), x], "half_x", op="prod")
    scaled = add(net, "ElementWise", [x, const(net, np.sqrt(2.0), "sqrt2")], "div", op="div")
    one_plus = add(net, "ElementWise", [add(net, "Unary", [scaled], "erf", op="erf"), const(net, 1.0, "one")],
                   "one_plus", op="sum")
    return add(net, "ElementWise", [half, one_plus], "gelu", op="prod")


def gelu_tanh(net, x):
    cube = add(net, "ElementWise", [x, const(net, 3.0, "three")], "cube", op="pow")
    inner = add(net, "ElementWise", [x, add(net, "ElementWise", [cube, const(net, 0.044715, "c")], "k", op="prod")],
                "inner", op="sum")
    t = add(net, "Activation", [add(net, "ElementWise", [inner, const(net, np.sqrt(2 / np.pi), "s")], "scaled",
                                    op="prod")], "tanh", type="tanh")
    one_plus = add(net, "ElementWise", [const(net, 1.0, "one"), t], "one_plus", op="sum")
    return add(net, "ElementWise", [add(net, "ElementWise", [x, const(net, 0.5, "half")], "half_x", op="prod"),
                                    one_plus], "gelu", op="prod")


@pytest.mark.parametrize("form, kind", [(swish, "swish"), (gelu_erf, "gelu_erf"), (gelu_tanh, "gelu_tanh")])
def test_subgraph_becomes_the_matrix_multiply_activation(form, kind):
    def make():
        net, (x,) = network((4, 6))
        net.mark_output(form(net, matmul(net, x, 5, "mm")))
        return net

    engine = build_and_compare(make, [rand(4, 6) * 3])
    (name,) = layer_names(engine)
    assert name.startswith("mm + ") and layer(engine, name).params["activation"] == {"type": kind}


def test_near_misses_are_not_recognized():
    def make():
        net, (x,) = network((4, 6))
        a = matmul(net, x, 5, "a")  # the sigmoid is read outside the subgraph
        s = add(net, "Activation", [a], "sig_a", type="sigmoid")
        net.mark_output(add(net, "ElementWise", [a, s], "swish_a", op="prod"))
        net.mark_output(s)
        b = matmul(net, x, 5, "b")  # x * sigmoid(2x) is no known activation
        two_b = add(net, "ElementWise", [b, const(net, 2.0, "two")], "two_b", op="prod")
        net.mark_output(add(net, "ElementWise", [b, add(net, "Activation", [two_b], "sig_b", type="sigmoid")],
                            "swish_b", op="prod"))
        c = matmul(net, x, 5, "c")  # a per-column constant is not a scalar
        c1 = add(net, "ElementWise", [c, const(net, [1, 1, 1, 1, 2], "per_column")], "c1", op="prod")
        net.mark_output(add(net, "ElementWise", [c, add(net, "Activation", [c1], "sig_c", type="sigmoid")], "swish_c",
                            op="prod"))
        return net

    names = layer_names(build_and_compare(make, [rand(4, 6)]))
    assert {"swish_a", "swish_b", "swish_c"} <= set(names)


@pytest.mark.parametrize("kind", ["gelu_erf", "gelu_tanh", "swish"])
def test_tensorflow_gelu_and_silu_become_one_layer(kind):
    w = rand(6, 5)

    def fn(x):
        y = tf.matmul(x, w)
        return tf.nn.silu(y) if kind == "swish" else tf.nn.gelu(y, approximate=kind == "gelu_tanh")

    engine = assert_converts(fn, [rand(4, 6) * 3])
    (mm,) = [l for l in engine.network.layers if l.kind != "Constant"]
    assert mm.kind == "MatrixMultiply" and mm.params["activation"] == {"type": kind}
