"""Reduction fusions (L1Norm, sum of squares, L2Norm, LogSum, LogSumExp) and Reduce -> Pooling."""
import numpy as np
import pytest

from fusion_nets import add, build_and_compare, const, layer, layer_names, network, rand

X = (2, 4, 5, 3)


def chain(before, after=(), reduce_op="sum", keep_dims=False, axes=(1, 2)):
    """x -> Unary `before` ops (or "x*x") -> Reduce -> Unary `after` ops -> output."""
    def make():
        net, (x,) = network(X)
        y = x
        for op in before:
            args = [y, y] if op == "x*x" else [y]
            y = add(net, "ElementWise" if op == "x*x" else "Unary", args, op, op="prod" if op == "x*x" else op)
        y = add(net, "Reduce", [y], reduce_op, op=reduce_op, axes=list(axes), keep_dims=keep_dims)
        for op in after:
            y = add(net, "Unary", [y], op, op=op)
        net.mark_output(y)
        return net
    return make


@pytest.mark.parametrize("before, after, fused_op, name", [
    (["abs"], [], "l1", "abs + sum"),
    (["square"], [], "sum_squares", "square + sum"),
    (["x*x"], [], "sum_squares", "x*x + sum"),
    (["square"], ["sqrt"], "l2", "square + sum + sqrt"),
    ([], ["log"], "log_sum", "sum + log"),
    (["exp"], ["log"], "log_sum_exp", "exp + sum + log"),
])
def test_reductions_fuse(before, after, fused_op, name):
    engine = build_and_compare(chain(before, after), [rand(*X, positive=not before)])
    assert layer_names(engine) == [name]
    assert layer(engine, name).params["op"] == fused_op


def test_x_to_the_power_2_is_a_square():
    def make():
        net, (x,) = network(X)
        sq = add(net, "ElementWise", [x, const(net, 2.0, "two")], "pow", op="pow")
        net.mark_output(add(net, "Reduce", [sq], "sum", op="sum", axes=[1], keep_dims=False))
        return net

    engine = build_and_compare(make, [rand(*X)])
    assert layer_names(engine) == ["pow + sum"] and layer(engine, "pow + sum").params["op"] == "sum_squares"


def test_log_sum_exp_overflows_as_its_layers_do():
    """exp(100) is Inf in float32, so TF's log(sum(exp(x))) is Inf: the fused op computes the same steps."""
    engine = build_and_compare(chain(["exp"], ["log"]), [rand(*X)])
    big = np.full(X, 100.0, "float32")
    out = engine.create_execution_context().execute_v2([big])[0]
    np.testing.assert_array_equal(out, np.full(out.shape, np.inf, "float32"))


def test_near_misses_do_not_fuse():
    def make():
        net, (x, y) = network(X, X)
        a = add(net, "Unary", [x], "abs", op="abs")  # abs also read elsewhere
        net.mark_output(add(net, "Reduce", [a], "l1_sum", op="sum", axes=[1], keep_dims=False))
        net.mark_output(a)
        xy = add(net, "ElementWise", [x, y], "x*y", op="prod")  # not a square
        net.mark_output(add(net, "Reduce", [xy], "xy_sum", op="sum", axes=[1], keep_dims=False))
        m = add(net, "Reduce", [add(net, "Unary", [y], "y_abs", op="abs")], "mean", op="mean", axes=[1],
                keep_dims=False)  # a mean, not a sum
        net.mark_output(add(net, "Unary", [m], "log", op="log"))
        return net

    names = layer_names(build_and_compare(make, [rand(*X), rand(*X)]))
    assert {"abs", "l1_sum", "x*y", "xy_sum", "mean", "log"} <= set(names)


def test_spatial_mean_with_keep_dims_becomes_global_average_pooling():
    engine = build_and_compare(chain([], reduce_op="mean", keep_dims=True), [rand(*X)])
    (pool,) = engine.network.layers
    assert pool.kind == "Pooling" and pool.name == "mean (pooling)" and pool.params["window"] == [4, 5]
    assert engine.outputs[0].shape == (2, 1, 1, 3)


@pytest.mark.parametrize("keep_dims, axes", [(False, (1, 2)), (True, (1, 3)), (True, (2,))])
def test_other_means_stay_reduces(keep_dims, axes):
    engine = build_and_compare(chain([], reduce_op="mean", keep_dims=keep_dims, axes=axes), [rand(*X)])
    assert [l.kind for l in engine.network.layers] == ["Reduce"]
