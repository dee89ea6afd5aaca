"""Bias and scale folding into Convolution / MatrixMultiply, and identity erasure."""
import numpy as np
import pytest

from fusion_nets import add, build_and_compare, conv, const, layer, layer_names, matmul, network, rand

X = (2, 6, 6, 3)


def conv_then(op, value, const_first=False):
    """conv -> ElementWise(op, constant `value`) -> output."""
    def make():
        net, (x,) = network(X)
        y = conv(net, x, 4, "conv")
        c = const(net, value, "c")
        net.mark_output(add(net, "ElementWise", [c, y] if const_first else [y, c], "ew", op=op))
        return net
    return make


@pytest.mark.parametrize("op, value, const_first", [
    ("sum", rand(4), False), ("sum", rand(1, 1, 1, 4), True), ("sum", [0.5], False), ("sub", rand(4), False),
    ("sub", rand(4), True), ("prod", rand(4), False), ("prod", [2.0], True), ("div", rand(4, positive=True), False),
])
def test_per_channel_constants_fold_into_the_convolution(op, value, const_first):
    engine = build_and_compare(conv_then(op, value, const_first), [rand(*X)])
    assert layer_names(engine) == ["conv + ew"]


def test_batch_norm_like_mul_add_and_a_scale_fold_in_order():
    def make():
        net, (x,) = network(X)
        y = conv(net, x, 4, "conv", bias=True)
        y = add(net, "Scale", [y], "bias", {"shift": rand(4)})
        y = add(net, "ElementWise", [y, const(net, rand(4), "g")], "mul", op="prod")
        y = add(net, "ElementWise", [y, const(net, rand(4), "b")], "add", op="sum")
        net.mark_output(add(net, "Scale", [y], "bn", {"scale": rand(4), "shift": rand(4)}))
        return net

    engine = build_and_compare(make, [rand(*X)])
    assert layer_names(engine) == ["conv + bias + mul + add + bn"]
    assert [l.kind for l in engine.network.layers] == ["Convolution"]


@pytest.mark.parametrize("transpose_b", [False, True])
def test_matrix_multiply_takes_a_bias_and_a_shift(transpose_b):
    def make():
        net, (x,) = network((3, 5))
        y = matmul(net, x, 4, "mm", transpose_b=transpose_b)
        y = add(net, "ElementWise", [y, const(net, rand(4), "c")], "bias", op="sum")
        net.mark_output(add(net, "Scale", [y], "shift", {"shift": rand(4)}, channel_axis=1))
        return net

    engine = build_and_compare(make, [rand(3, 5)])
    assert layer_names(engine) == ["mm + bias + shift"]
    assert layer(engine, "mm + bias + shift").weights["bias"].shape == (4,)


def test_near_misses_do_not_fold():
    def make():
        net, (x, x1) = network(X, (2, 6, 6, 1))
        a = conv(net, x, 4, "a")  # a sum that broadcasts the convolution's output
        net.mark_output(add(net, "ElementWise", [a, const(net, rand(6, 6, 4), "hw")], "per_pixel", op="sum"))
        b = conv(net, x, 4, "b")  # a Scale with a power
        net.mark_output(add(net, "Scale", [b], "pow2", {"scale": rand(4), "power": np.full(4, 2.0, "float32")}))
        c = conv(net, x, 4, "c")  # a power that is not a constant
        net.mark_output(add(net, "ElementWise", [c, add(net, "Unary", [x1], "round", op="round")], "pow", op="pow"))
        d = conv(net, x, 4, "d")  # an intermediate that is also a network output
        net.mark_output(d)
        net.mark_output(add(net, "ElementWise", [d, const(net, rand(4), "cd")], "d_bias", op="sum"))
        e = conv(net, x, 4, "e", activation={"type": "relu"})  # a bias after the activation
        net.mark_output(add(net, "ElementWise", [e, const(net, rand(4), "ce")], "e_bias", op="sum"))
        f = matmul(net, add(net, "Shuffle", [x], "flat", reshape=[2, 108]), 4, "f")  # matmul scale: not folded
        net.mark_output(add(net, "ElementWise", [f, const(net, rand(4), "cf")], "f_scale", op="prod"))
        return net

    engine = build_and_compare(make, [rand(*X), rand(2, 6, 6, 1)])
    for name in ("per_pixel", "pow2", "pow", "d_bias", "e_bias", "f_scale"):
        assert name in layer_names(engine)


@pytest.mark.parametrize("op, value, const_first", [
    ("sum", 0.0, True), ("sub", [0.0, 0.0, 0.0], False), ("prod", 1.0, False), ("div", 1.0, False),
    ("pow", 1.0, False)])
def test_identity_elementwise_is_erased(op, value, const_first):
    def make():
        net, (x,) = network((2, 3))
        y = add(net, "Unary", [x], "exp", op="exp")
        c = const(net, value, "c")
        y = add(net, "ElementWise", [c, y] if const_first else [y, c], "identity", op=op)
        net.mark_output(add(net, "Unary", [y], "abs", op="abs"))
        return net

    assert layer_names(build_and_compare(make, [rand(2, 3)])) == ["exp", "abs"]


def test_identity_scale_is_erased_but_not_at_an_output_or_when_it_broadcasts():
    def make():
        net, (x,) = network((2, 3))
        y = add(net, "Scale", [x], "scale1", {"scale": np.ones(3, "float32"), "power": np.ones(1, "float32")})
        net.mark_output(add(net, "Unary", [y], "abs", op="abs"))
        net.mark_output(add(net, "Scale", [x], "at_output", {"shift": np.zeros(1, "float32")}))
        z = add(net, "ElementWise", [const(net, np.zeros((4, 2, 3)), "zeros"), x], "broadcast", op="sum")
        net.mark_output(add(net, "ElementWise", [const(net, 0.0, "zero"), x], "zero_minus", op="sub"))
        net.mark_output(z)
        return net

    assert layer_names(build_and_compare(make, [rand(2, 3)])) == ["abs", "at_output", "broadcast", "zero_minus"]


def test_batch_norm_folds_into_a_depthwise_convolution():
    def make():
        net, (x,) = network(X)
        y = add(net, "Convolution", [x], "dw", {"kernel": rand(3, 3, 1, 3)}, strides=[1, 1], dilations=[1, 1],
                pre_padding=[1, 1], post_padding=[1, 1], groups=3)
        net.mark_output(add(net, "Scale", [y], "bn", {"scale": rand(3), "shift": rand(3)}))
        return net

    assert layer_names(build_and_compare(make, [rand(*X)])) == ["dw + bn"]


def test_a_reshape_between_convolution_and_bias_keeps_them_apart():
    def make():
        net, (x,) = network(X)
        y = add(net, "Shuffle", [conv(net, x, 4, "conv")], "reshape", reshape=[2, 36, 2, 2])  # last axis: not channels
        net.mark_output(add(net, "ElementWise", [y, const(net, rand(2), "c")], "bias", op="sum"))
        return net

    assert layer_names(build_and_compare(make, [rand(*X)])) == ["conv", "reshape", "bias"]
