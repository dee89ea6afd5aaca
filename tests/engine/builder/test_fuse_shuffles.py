"""Shuffle + Shuffle composition (the seed's rule when both reshape) and Shuffle + Reduce."""
import pytest

from fusion_nets import add, build_and_compare, layer, layer_names, network, rand
from tftrt_py.engine.builder.fusions.shuffle import then

X = (2, 3, 4, 5)


def two_shuffles(first, second):
    def make():
        net, (x,) = network(X)
        y = add(net, "Shuffle", [add(net, "Shuffle", [x], "s1", **first)], "s2", **second)
        net.mark_output(add(net, "Unary", [y], "abs", op="abs"))
        return net
    return make


def test_permutations_compose():
    assert then([0, 2, 3, 1], [0, 3, 1, 2]) is None
    assert then([1, 0, 2], [0, 2, 1]) == [1, 2, 0]
    assert then(None, [1, 0]) == [1, 0] and then([0, 1], None) is None


@pytest.mark.parametrize("first, second, fused", [
    (dict(first_perm=[0, 2, 3, 1]), dict(first_perm=[0, 3, 1, 2]), None),
    (dict(reshape=[6, 20]), dict(reshape=[2, 3, 4, 5]), None),
    (dict(first_perm=[0, 2, 1, 3]), dict(first_perm=[0, 1, 3, 2]), dict(first_perm=[0, 2, 3, 1])),
    (dict(reshape=[6, -1]), dict(reshape=[120]), dict(reshape=[120])),
    (dict(first_perm=[0, 3, 1, 2]), dict(reshape=[2, 5, 12]), dict(first_perm=[0, 3, 1, 2], reshape=[2, 5, 12])),
    (dict(reshape=[6, 20]), dict(first_perm=[1, 0]), dict(reshape=[6, 20], second_perm=[1, 0])),
    (dict(reshape=[6, 4, 5], second_perm=[0, 2, 1]), dict(first_perm=[0, 2, 1], reshape=[6, 20]),
     dict(reshape=[6, 20])),
], ids=["inverse perms", "reshape back", "perms", "reshapes", "perm then reshape", "reshape then perm",
        "both reshape, inverse transposes between"])
def test_two_shuffles_become_one_or_none(first, second, fused):
    engine = build_and_compare(two_shuffles(first, second), [rand(*X)])
    if fused is None:
        assert layer_names(engine) == ["abs"]
    else:
        assert layer_names(engine) == ["s1 + s2", "abs"]
        assert layer(engine, "s1 + s2").params == fused


def test_both_reshaping_without_inverse_transposes_do_not_fuse():
    first, second = dict(reshape=[6, 4, 5], second_perm=[0, 2, 1]), dict(first_perm=[1, 0, 2], reshape=[5, 24])
    assert layer_names(build_and_compare(two_shuffles(first, second), [rand(*X)])) == ["s1", "s2", "abs"]


@pytest.mark.parametrize("shape, params, kept", [
    (X, dict(reshape=list(X)), []), (X, dict(first_perm=[0, 1, 2, 3]), []),
    ((2, 1, 1, 5), dict(first_perm=[0, 2, 1, 3]), []),  # swaps two axes of size 1
    ((2, 3, 3, 5), dict(first_perm=[0, 2, 1, 3]), ["noop"]),  # same shape, elements move
])
def test_a_shuffle_that_moves_nothing_is_erased(shape, params, kept):
    def make():
        net, (x,) = network(shape)
        y = add(net, "Shuffle", [x], "noop", **params)
        net.mark_output(add(net, "Unary", [y], "abs", op="abs"))
        return net

    assert layer_names(build_and_compare(make, [rand(*shape)])) == kept + ["abs"]


def test_an_erased_pair_at_the_output_stays():
    def make():
        net, (x,) = network(X)
        net.mark_output(add(net, "Shuffle", [add(net, "Shuffle", [x], "s1", reshape=[120])], "s2", reshape=list(X)))
        return net

    assert layer_names(build_and_compare(make, [rand(*X)])) == ["s1 + s2"]


@pytest.mark.parametrize("shuffle", [dict(first_perm=[0, 2, 3, 1]), dict(first_perm=[0, 2, 1, 3], second_perm=[0,
                                     1, 3, 2])])
def test_a_permutation_folds_into_a_keep_dims_reduce(shuffle):
    def make():
        net, (x,) = network(X)
        y = add(net, "Shuffle", [x], "nhwc", **shuffle)
        net.mark_output(add(net, "Reduce", [y], "sum", op="sum", axes=[1, 2], keep_dims=True))
        return net

    engine = build_and_compare(make, [rand(*X)])
    assert layer_names(engine) == ["nhwc + sum"]
    assert layer(engine, "nhwc + sum").params["first_perm"] == [0, 2, 3, 1]


@pytest.mark.parametrize("shuffle, keep_dims", [(dict(first_perm=[0, 2, 3, 1]), False),
                                                (dict(first_perm=[0, 2, 3, 1], reshape=[2, 20, 3, 1]), True)])
def test_no_reduce_fusion_without_keep_dims_or_with_a_reshape(shuffle, keep_dims):
    def make():
        net, (x,) = network(X)
        y = add(net, "Shuffle", [x], "shuffle", **shuffle)
        net.mark_output(add(net, "Reduce", [y], "sum", op="sum", axes=[1, 2], keep_dims=keep_dims))
        return net

    assert layer_names(build_and_compare(make, [rand(*X)])) == ["shuffle", "sum"]
