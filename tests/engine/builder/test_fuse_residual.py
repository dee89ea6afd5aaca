"""Residual sums and zero padding fused into Convolutions."""
import numpy as np
import pytest

from fusion_nets import add, build_and_compare, conv, const, layer, layer_names, network, rand

X = (2, 6, 6, 4)


@pytest.mark.parametrize("residual_shape", [X, (1, 6, 6, 4)])
def test_a_residual_sum_and_the_activation_after_it_fuse(residual_shape):
    def make():
        net, (x, r) = network(X, residual_shape)
        y = conv(net, x, 4, "conv", bias=True)
        y = add(net, "ElementWise", [r, y], "add", op="sum")
        net.mark_output(add(net, "Activation", [y], "relu", type="relu"))
        return net

    engine = build_and_compare(make, [rand(*X), rand(*residual_shape)])
    assert layer_names(engine) == ["conv + add + relu"]
    fused = layer(engine, "conv + add + relu")
    assert [t.name for t in fused.inputs] == ["x0", "x1"] and fused.params["activation"] == {"type": "relu"}


def test_between_two_convolutions_the_later_one_takes_the_sum():
    def make():
        net, (x,) = network(X)
        a = conv(net, x, 4, "shortcut", k=1)
        b = conv(net, conv(net, x, 4, "conv1"), 4, "conv2")
        net.mark_output(add(net, "ElementWise", [a, b], "add", op="sum"))
        return net

    engine = build_and_compare(make, [rand(*X)])
    assert layer_names(engine) == ["shortcut", "conv1", "conv2 + add"]


def test_near_misses_keep_the_sum():
    def make():
        net, (x,) = network(X)
        per_pixel = add(net, "Reduce", [x], "mean", op="mean", axes=[3], keep_dims=True)  # [2, 6, 6, 1]
        net.mark_output(add(net, "ElementWise", [conv(net, x, 4, "a"), per_pixel], "broadcast_sum", op="sum"))
        b = conv(net, x, 4, "b", activation={"type": "relu"})  # the activation comes before the sum
        net.mark_output(add(net, "ElementWise", [b, x], "after_relu", op="sum"))
        c = conv(net, x, 4, "c")  # the convolution's output has a second reader
        net.mark_output(add(net, "Unary", [c], "abs", op="abs"))
        net.mark_output(add(net, "ElementWise", [c, x], "shared", op="sum"))
        d = conv(net, x, 1, "d")  # the sum broadcasts the convolution's output
        net.mark_output(add(net, "ElementWise", [d, x], "widening", op="sum"))
        return net

    names = layer_names(build_and_compare(make, [rand(*X)]))
    assert {"broadcast_sum", "after_relu", "shared", "widening"} <= set(names)


def test_zero_spatial_padding_folds_into_the_convolution():
    def make():
        net, (x,) = network(X)
        y = add(net, "Padding", [x], "pad", pre=[0, 2, 1, 0], post=[0, 1, 2, 0])
        net.mark_output(conv(net, y, 3, "conv", pad=1, stride=2))
        return net

    engine = build_and_compare(make, [rand(*X)])
    assert layer_names(engine) == ["pad + conv"]
    assert layer(engine, "pad + conv").params["pre_padding"] == [3, 2]


@pytest.mark.parametrize("params", [dict(pre=[0, 1, 1, 1], post=[0, 1, 1, 0]), dict(pre=[0, 1, 1, 0],
                         post=[0, 1, 1, 0], value=1.0), dict(pre=[0, 1, 1, 0], post=[0, 1, 1, 0], mode="reflect")])
def test_other_padding_stays(params):
    def make():
        net, (x,) = network(X)
        net.mark_output(conv(net, add(net, "Padding", [x], "pad", **params), 3, "conv"))
        return net

    assert layer_names(build_and_compare(make, [rand(*X)])) == ["pad", "conv"]


def test_constant_residual_with_a_batch_of_one_serves_smaller_batches():
    def make():
        net, (x,) = network(X)
        y = add(net, "ElementWise", [conv(net, x, 4, "conv"), const(net, rand(1, 6, 6, 4), "r")], "add", op="sum")
        net.mark_output(y)
        return net

    engine = build_and_compare(make, [rand(*X)])
    assert layer_names(engine) == ["conv + add"] and engine.rowwise
    small = rand(1, *X[1:])
    full = np.concatenate([small, small])
    out = engine.create_execution_context().execute_v2([small])[0]
    np.testing.assert_allclose(out, engine.create_execution_context().execute_v2([full])[0][:1], rtol=1e-6)
