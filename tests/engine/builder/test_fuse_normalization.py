"""Layer normalization fusion: Reduce-based LayerNorms (centered as in BERT, or TF's batch_normalization form as
Keras writes it) become one Normalization layer, taking the residual sum before and the affines after it."""
import numpy as np
import pytest

from fusion_nets import add, build_and_compare, const, layer_names, network, rand
from tftrt_py.engine.builder.fusions.match import fusion_counts

X = (2, 3, 8)
EPS = 1e-3


def mean(net, t, name, axis=-1):
    return add(net, "Reduce", [t], name, op="mean", axes=[axis], keep_dims=True)


def inverse_std(net, var, form="rsqrt", eps=EPS):
    """1 / sqrt(var + eps) as rsqrt, recip of sqrt or 1 / sqrt."""
    v = add(net, "ElementWise", [const(net, [[[eps]]], "eps"), var], "var_eps", op="sum")
    if form == "rsqrt":
        return add(net, "Unary", [v], "rsqrt", op="rsqrt")
    root = add(net, "Unary", [v], "sqrt", op="sqrt")
    if form == "recip":
        return add(net, "Unary", [root], "recip", op="recip")
    return add(net, "ElementWise", [const(net, 1.0, "one"), root], "one_over", op="div")


def centered(net, x, square="d*d", form="rsqrt", axis=-1, eps=EPS):
    """(x - mean) * rsqrt(var + EPS) (or / sqrt(var + EPS) with form "div"); `square` of d = x - mean."""
    m = mean(net, x, "mean", axis)
    d = add(net, "ElementWise", [x, m], "center", op="sub")
    if square == "d*d":
        sq = add(net, "ElementWise", [d, d], "square", op="prod")
    elif square == "d**2":
        sq = add(net, "ElementWise", [d, const(net, 2.0, "two")], "square", op="pow")
    elif square == "squared_difference":
        sq = add(net, "ElementWise", [m, x], "square", op="squared_difference")
    else:
        sq = add(net, "Unary", [d], "square", op="square")
    var = mean(net, sq, "var", axis)
    if form == "div":
        v = add(net, "ElementWise", [var, const(net, EPS, "eps")], "var_eps", op="sum")
        return add(net, "ElementWise", [d, add(net, "Unary", [v], "sqrt", op="sqrt")], "normalize", op="div")
    return add(net, "ElementWise", [inverse_std(net, var, form, eps), d], "normalize", op="prod")


def batch_norm_form(net, x, gamma=True, offset="keras"):
    """x * m + offset with m = gamma * rsqrt(var + EPS) (or without gamma); offset "keras": beta + (-mean) * m,
    "tf": beta - mean * m, "none": -mean * m."""
    m = mean(net, x, "mean")
    sq = add(net, "ElementWise", [x, m], "squared_difference", op="squared_difference")
    inv = inverse_std(net, mean(net, sq, "var"))
    if gamma:
        inv = add(net, "ElementWise", [const(net, rand(1, 1, X[-1]), "gamma"), inv], "mul", op="prod")
    beta = const(net, rand(1, 1, X[-1]), "beta")
    if offset == "tf":
        rest = add(net, "ElementWise", [beta, add(net, "ElementWise", [m, inv], "mul_1", op="prod")], "add_1", op="sub")
    else:
        rest = add(net, "ElementWise", [add(net, "Unary", [m], "neg", op="neg"), inv], "mul_1", op="prod")
        if offset == "keras":
            rest = add(net, "ElementWise", [beta, rest], "add_1", op="sum")
    return add(net, "ElementWise", [rest, add(net, "ElementWise", [x, inv], "mul_2", op="prod")], "add_2", op="sum")


def one_input(body):
    def make():
        net, (x,) = network(X)
        net.mark_output(body(net, x))
        return net
    return make


def only_normalization(engine):
    norm, = [l for l in engine.network.layers if l.kind != "Constant"]
    assert norm.kind == "Normalization" and norm.params == {"epsilon": pytest.approx(EPS)}
    return norm


@pytest.mark.parametrize("square", ["d*d", "d**2", "x^2", "squared_difference"])
@pytest.mark.parametrize("form", ["rsqrt", "recip", "one_over", "div"])
def test_centered_layer_norm_fuses(square, form):
    engine = build_and_compare(one_input(lambda net, x: centered(net, x, square, form)), [rand(*X) * 3 + 1])
    norm = only_normalization(engine)
    np.testing.assert_array_equal(norm.weights["scale"], np.ones(X[-1]))
    np.testing.assert_array_equal(norm.weights["bias"], np.zeros(X[-1]))
    assert fusion_counts(engine.network) == {"layer normalization": 1}


def test_an_epsilon_of_zero_is_erased_before_and_kept_as_zero():
    engine = build_and_compare(one_input(lambda net, x: centered(net, x, eps=0.0)), [rand(*X)])
    assert [l.kind for l in engine.network.layers] == ["Normalization"]
    assert engine.network.layers[0].params == {"epsilon": 0.0}


@pytest.mark.parametrize("affine", ["Scale", "mul, add", "add"])
def test_affines_after_it_fold_into_scale_and_bias(affine):
    gamma, beta = rand(X[-1]), rand(X[-1])

    def body(net, x):
        y = centered(net, x, axis=len(X) - 1)
        if affine == "Scale":
            return add(net, "Scale", [y], "affine", {"scale": gamma, "shift": beta}, channel_axis=-1)
        if affine == "mul, add":
            y = add(net, "ElementWise", [y, const(net, gamma, "gamma")], "gamma_mul", op="prod")
        return add(net, "ElementWise", [const(net, beta, "beta"), y], "beta_add", op="sum")

    norm = only_normalization(build_and_compare(one_input(body), [rand(*X)]))
    np.testing.assert_allclose(norm.weights["scale"], gamma if affine != "add" else 1, rtol=1e-6)
    np.testing.assert_allclose(norm.weights["bias"], beta, rtol=1e-6)


@pytest.mark.parametrize("gamma", [True, False])
@pytest.mark.parametrize("offset", ["keras", "tf", "none"])
def test_batch_norm_form_fuses(gamma, offset):
    engine = build_and_compare(one_input(lambda net, x: batch_norm_form(net, x, gamma, offset)), [rand(*X) * 3])
    norm = only_normalization(engine)
    assert np.any(norm.weights["bias"] != 0) == (offset != "none")


@pytest.mark.parametrize("body", [centered, batch_norm_form])
def test_residual_sum_before_it_becomes_its_second_input(body):
    def make():
        net, (a, b) = network(X, X)
        net.mark_output(body(net, add(net, "ElementWise", [a, b], "residual", op="sum")))
        return net

    engine = build_and_compare(make, [rand(*X), rand(*X)])
    assert [t.name for t in only_normalization(engine).inputs] == ["x0", "x1"]
    assert fusion_counts(engine.network)["Normalization + residual sum"] == 1


def test_near_misses_do_not_fuse():
    def make():
        net, (x, y, z, r) = network(X, X, X, (1, 1, X[-1]))
        net.mark_output(centered(net, x, axis=1))  # statistics over another axis
        d = centered(net, y)
        net.mark_output(d)
        net.mark_output(next(l for l in net.layers if l.name.startswith("center")
                             and l.inputs[0] is y).outputs[0])  # x - mean read elsewhere
        v = add(net, "ElementWise", [mean(net, add(net, "ElementWise", [z, z], "zz", op="prod"), "ms"),
                                     const(net, [EPS] * X[-1], "eps_vector")], "ms_eps", op="sum")
        net.mark_output(add(net, "ElementWise", [add(net, "Unary", [v], "rms", op="rsqrt"), z], "rms_norm",
                            op="prod"))  # no centering (RMS norm)
        s = add(net, "ElementWise", [x, r], "broadcast_sum", op="sum")  # the residual broadcasts
        net.mark_output(centered(net, s))
        return net

    engine = build_and_compare(make, [rand(*X), rand(*X), rand(*X), rand(1, 1, X[-1])])
    names = layer_names(engine)
    assert sum(l.kind == "Normalization" for l in engine.network.layers) == 1
    assert "broadcast_sum" in names and "rms_norm" in names
    norm = next(l for l in engine.network.layers if l.kind == "Normalization")
    assert len(norm.inputs) == 1 and norm.inputs[0].producer.name == "broadcast_sum"
