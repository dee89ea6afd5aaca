"""Zero padding folded into the Pooling after it: a pooling without padding of its own as count_include_pad
(its padding then zeros, exact for any input, NaN included), a max pooling with padding of its own behind a
non-negative activation."""
from unittest import mock

import numpy as np
import pytest

import fusion_nets
from fusion_nets import add, build_and_compare, conv, layer, layer_names, network, rand
from tftrt_py.engine import Builder, builder

X = (2, 7, 7, 4)


def pool(net, x, name, kind="max", window=3, stride=2, pad=0, **params):
    return add(net, "Pooling", [x], name, type=kind, window=[window] * 2, strides=[stride] * 2,
               pre_padding=[pad] * 2, post_padding=[pad] * 2, **params)


def stem(activation, pre=(0, 1, 1, 0), post=(0, 1, 1, 0), window=3, stride=2, pool_pad=0):
    """conv(activation) -> Padding -> max pool, as ResNet-50's stem."""
    def make():
        net, (x,) = network(X)
        y = conv(net, x, 4, "conv", activation=activation)
        y = add(net, "Padding", [y], "pad", pre=list(pre), post=list(post))
        net.mark_output(pool(net, y, "pool", window=window, stride=stride, pad=pool_pad))
        return net
    return make


@pytest.mark.parametrize("activation", [{"type": "relu"}, {"type": "relu6"}, {"type": "sigmoid"},
                                        {"type": "clip", "alpha": 0.0, "beta": 1.0}])
def test_padding_folds_into_max_pooling_after_a_nonnegative_activation(activation):
    engine = build_and_compare(stem(activation, pool_pad=1), [rand(*X)])
    assert layer_names(engine) == ["conv", "pad + pool"]
    assert layer(engine, "pad + pool").params["pre_padding"] == [2, 2]


@pytest.mark.parametrize("geometry", [dict(pool_pad=1), dict(pre=(0, 2, 0, 0), post=(0, 0, 2, 0)),
                                      dict(pre=(0, 0, 0, 0), post=(0, 2, 2, 0), window=2, stride=4)])
def test_windows_that_still_reach_the_input_fold(geometry):
    engine = build_and_compare(stem({"type": "relu"}, **geometry), [rand(*X)])
    assert layer_names(engine) == ["conv", "pad + pool"]


@pytest.mark.parametrize("kind", ["Activation", "MatrixMultiply"])
def test_an_activation_layer_or_another_fused_one_makes_the_input_nonnegative(kind):
    def make():
        net, (x,) = network(X)
        if kind == "Activation":
            y = add(net, "Activation", [add(net, "Unary", [x], "sin", op="sin")], "softplus", type="softplus")
        else:
            y = add(net, "MatrixMultiply", [x, net.add_constant(rand(4, 4), name="w")], "mm",
                    activation={"type": "relu"})
        net.mark_output(pool(net, add(net, "Padding", [y], "pad", pre=[0, 1, 1, 0], post=[0, 1, 1, 0]), "pool"))
        return net

    assert "pad" not in layer_names(build_and_compare(make, [rand(*X)]))


def test_any_input_folds_into_a_max_pooling_without_padding_of_its_own():
    """The pooling's padding becomes zeros (count_include_pad): whatever the activation, and for windows of
    padding alone."""
    pads = dict(pre=[0, 1, 1, 0], post=[0, 1, 1, 0])

    def make():
        net, (x,) = network(X)
        for name, act in (("none", None), ("leaky", {"type": "leaky_relu", "alpha": 0.1}), ("tanh", {"type": "tanh"})):
            y = conv(net, x, 4, name, activation=act)
            net.mark_output(pool(net, add(net, "Padding", [y], f"{name}_pad", **pads), f"{name}_pool"))
        r = conv(net, x, 4, "relu", activation={"type": "relu"})
        for name, params in (("first_window", dict(pre=[0, 3, 0, 0], post=[0, 0, 0, 0])),  # only padding
                             ("last_window", dict(pre=[0, 0, 0, 0], post=[0, 0, 4, 0]))):
            net.mark_output(pool(net, add(net, "Padding", [r], f"{name}_pad", **params), f"{name}_pool"))
        return net

    engine = build_and_compare(make, [rand(*X)])
    assert not [n for n in layer_names(engine) if n.endswith("_pad")]
    assert all(l.params.get("count_include_pad") for l in engine.network.layers if l.kind == "Pooling")


def test_nan_inputs_give_what_the_padding_gave():
    """An all-NaN window reaching the padding gives 0 (the zeros win over skipped NaN), as TF's MaxPool on the
    zero-padded tensor does; one inside the input gives float32's lowest."""
    def make():
        net, (x,) = network((1, 4, 4, 1))
        net.mark_output(pool(net, add(net, "Padding", [x], "pad", pre=[0, 1, 1, 0], post=[0, 1, 1, 0]), "pool",
                             window=2, stride=2))
        return net

    x = np.full((1, 4, 4, 1), np.nan, np.float32)
    x[0, 3, 3, 0] = -5.0  # in a window with padding: the zeros win
    engine = Builder().build_engine(make())
    assert layer_names(engine) == ["pad + pool"]
    got = engine.create_execution_context().execute_v2([x])[0][0, :, :, 0]
    lowest = np.finfo(np.float32).min
    np.testing.assert_array_equal(got, [[0, 0, 0], [0, lowest, 0], [0, 0, 0]])


def test_near_misses_keep_the_padding():
    pads = dict(pre=[0, 1, 1, 0], post=[0, 1, 1, 0])

    def make():
        net, (x,) = network(X)
        for name, act in (("none", None), ("leaky", {"type": "leaky_relu", "alpha": 0.1}), ("tanh", {"type": "tanh"}),
                          ("clip", {"type": "clip", "alpha": -1.0, "beta": 1.0})):  # may be negative
            y = conv(net, x, 4, name, activation=act)  # into a max pooling that ignores padding of its own
            net.mark_output(pool(net, add(net, "Padding", [y], f"{name}_pad", **pads), f"{name}_pool", pad=1))
        r = conv(net, x, 4, "relu", activation={"type": "relu"})
        for name, params in (("one", dict(pads, value=1.0)), ("reflect", dict(pads, mode="reflect")),
                             ("batch", dict(pre=[1, 1, 1, 0], post=[0, 1, 1, 0])),
                             ("channel", dict(pre=[0, 1, 1, 0], post=[0, 1, 1, 2]))):
            net.mark_output(pool(net, add(net, "Padding", [r], f"{name}_pad", **params), f"{name}_pool"))
        for name, params in (("first_window", dict(pre=[0, 3, 0, 0], post=[0, 0, 0, 0])),  # only padding
                             ("last_window", dict(pre=[0, 0, 0, 0], post=[0, 0, 4, 0]))):
            net.mark_output(pool(net, add(net, "Padding", [r], f"{name}_pad", **params), f"{name}_pool", pad=1))
        shared = add(net, "Padding", [r], "shared_pad", **pads)  # read twice
        net.mark_output(pool(net, shared, "shared_pool"))
        net.mark_output(add(net, "Unary", [shared], "abs", op="abs"))
        out = add(net, "Padding", [r], "out_pad", **pads)  # a network output
        net.mark_output(out)
        net.mark_output(pool(net, out, "out_pool"))
        avg_pads = dict(pre=[0, 1, 2, 0], post=[0, 2, 1, 0])  # not shared_pad's: equal layers merge
        net.mark_output(pool(net, add(net, "Padding", [r], "avg_pad", **avg_pads), "avg_pool", kind="avg", pad=1,
                             count_include_pad=False))  # average pooling that does not count its own padding
        return net

    names = layer_names(build_and_compare(make, [rand(*X)]))
    kept = [n[:-4] for n in names if n.endswith("_pad")]
    assert kept == ["none", "leaky", "tanh", "clip", "one", "reflect", "batch", "channel", "first_window",
                    "last_window", "shared", "out", "avg"]


@pytest.mark.parametrize("pad, include", [(0, False), (1, True)])
def test_average_pooling_folds_as_count_include_pad(pad, include):
    def make():
        net, (x,) = network(X)
        y = add(net, "Padding", [x], "pad", pre=[0, 1, 2, 0], post=[0, 2, 1, 0])
        net.mark_output(pool(net, y, "pool", kind="avg", pad=pad, count_include_pad=include))
        return net

    engine = build_and_compare(make, [rand(*X)])
    assert layer_names(engine) == ["pad + pool"] and layer(engine, "pad + pool").params["count_include_pad"]


def test_the_fold_changes_no_value():
    """Bit-for-bit the output of the same build with the pass left out."""
    def build(pipeline):
        fusion_nets.RNG[0] = np.random.default_rng(3)
        with mock.patch.object(builder, "PIPELINE", pipeline):
            return Builder().build_engine(stem({"type": "relu"}, pool_pad=1)())

    folded = build(builder.PIPELINE)
    unfolded = build([p for p in builder.PIPELINE if p[0] != "padding into pooling"])
    assert [l.kind for l in unfolded.network.layers] == ["Convolution", "Padding", "Pooling"]
    assert [l.kind for l in folded.network.layers] == ["Convolution", "Pooling"]
    x = rand(*X) * 4
    np.testing.assert_array_equal(folded.create_execution_context().execute_v2([x])[0],
                                  unfolded.create_execution_context().execute_v2([x])[0])
