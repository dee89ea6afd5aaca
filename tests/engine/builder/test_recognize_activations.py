"""Swish, both GELU forms, hard sigmoid and hard swish recognized in element-wise subgraphs (then fused like any
activation)."""
import numpy as np
import pytest
import tensorflow as tf

from fusion_nets import add, build_and_compare, const, conv, layer, layer_names, matmul, network, rand
from support import assert_converts, run_engine
from tftrt_py.engine.reference import ACTIVATION_FNS
from tftrt_py.engine.quantization import round_fp16
from tftrt_py.engine.builder.fusions.activation import SIXTH


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


def hard(net, x, name, swish=True, shift=3.0, clip="relu6", op="div", c=6.0):
    """Keras's hard swish x * relu6(x + 3) / 6 (or hard sigmoid, swish=False), with its constants and ops as given."""
    s = add(net, "ElementWise", [x, const(net, shift, f"{name}/shift")], f"{name}/plus", op="sum")
    r = add(net, "Activation", [s], f"{name}/clip", type=clip)
    h = add(net, "ElementWise", [r, const(net, c, f"{name}/c")], f"{name}/scaled", op=op)
    return add(net, "ElementWise", [x, h], name, op="prod") if swish else h


HARD_FORMS = {"hard_swish": (dict(swish=True), {"type": "hard_swish"}),
              "hard_swish_times_sixth": (dict(swish=True, op="prod", c=1 / 6), {"type": "hard_swish", "alpha": SIXTH}),
              "hard_sigmoid": (dict(swish=False), {"type": "hard_sigmoid"}),
              "hard_sigmoid_times_sixth": (dict(swish=False, op="prod", c=1 / 6),
                                           {"type": "hard_sigmoid", "alpha": SIXTH})}


@pytest.mark.parametrize("form", sorted(HARD_FORMS))
@pytest.mark.parametrize("producer", ["matmul", "conv"])
def test_hard_sigmoid_and_swish_become_the_producer_activation_bit_for_bit(form, producer):
    kwargs, act = HARD_FORMS[form]

    def make():
        net, (x,) = network((4, 6) if producer == "matmul" else (2, 5, 5, 3))
        y = matmul(net, x, 5, "p") if producer == "matmul" else conv(net, x, 4, "p", bias=True)
        net.mark_output(hard(net, y, "h", **kwargs))
        return net

    engine = build_and_compare(make, [rand(4, 6) * 3] if producer == "matmul" else [rand(2, 5, 5, 3) * 3],
                               rtol=0, atol=0)
    (name,) = layer_names(engine)
    assert name.startswith("p + ") and layer(engine, name).params["activation"] == act


def test_hard_swish_near_misses_are_not_recognized():
    def make():
        net, (x,) = network((4, 6))
        for name, kwargs in {"plus2": dict(shift=2.0), "over5": dict(c=5.0), "relu": dict(clip="relu"),
                             "sigmoid_over5": dict(swish=False, c=5.0)}.items():
            net.mark_output(hard(net, matmul(net, x, 5, f"mm_{name}"), name, **kwargs))
        return net

    engine = build_and_compare(make, [rand(4, 6) * 3])
    assert {"plus2", "over5", "relu", "sigmoid_over5/scaled"} <= set(layer_names(engine))
    acts = [l.params.get("activation") or l.params for l in engine.network.layers]
    assert not any(a.get("type", "").startswith("hard_") for a in acts)


def _keras_hard_activations():
    """Keras's hard swish (its backend: relu6(x + 3) / 6 times x) and MobileNetV3's hard sigmoid (times 1/6)."""
    import keras
    x = keras.Input((6,))
    h = keras.layers.Activation("hard_swish")(x)
    s = keras.layers.ReLU(6.0)(h + 3.0) * (1.0 / 6.0)
    return keras.Model(x, [h, s])


def test_keras_hard_swish_and_hard_sigmoid_match_tensorflow_bit_for_bit():
    model = _keras_hard_activations()
    x = np.concatenate([rand(64, 6) * 4, np.linspace(-3.5, 3.5, 6 * 64, dtype=np.float32).reshape(64, 6)])
    engine = assert_converts(lambda v: model(v), [x], rtol=0, atol=0)
    acts = [l.params for l in engine.network.layers if l.kind == "Activation"]
    assert acts == [{"type": "hard_swish"}, {"type": "hard_sigmoid", "alpha": SIXTH}]


def test_fp16_hard_swish_rounds_once():
    """FP16: the fused activation rounds its input and output once; as four layers it rounded four times."""
    fn = lambda v: v * (tf.nn.relu6(v + 3.0) / 6.0)  # noqa: E731
    x = np.linspace(-5, 5, 4001, dtype=np.float32).reshape(1, -1)
    engine, (got,) = run_engine(fn, [x], precision="FP16")
    assert [l.params for l in engine.network.layers if l.kind == "Activation"] == [{"type": "hard_swish"}]
    want = fn(tf.constant(x)).numpy()
    r = round_fp16
    np.testing.assert_array_equal(got, r(ACTIVATION_FNS["hard_swish"](r(x), None, None)))
    xr = r(x)
    four = r(xr * r(r(np.clip(r(xr + np.float32(3)), 0, 6)) / np.float32(6)))
    fused_error, four_error = np.max(np.abs(got - want)), np.max(np.abs(four - want))
    assert fused_error < 0.75 * four_error
