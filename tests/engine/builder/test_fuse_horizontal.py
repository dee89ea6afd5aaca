"""Horizontal fusion: sibling Convolutions / MatrixMultiplies as one layer followed by Slices."""
import pytest

from fusion_nets import add, build_and_compare, conv, layer, layer_names, matmul, network, rand
from tftrt_py.engine import Builder, BuilderConfig
from tftrt_py.engine.backends.onnxruntime import available

X = (2, 6, 6, 3)


def test_sibling_convolutions_become_one_with_slices():
    def make():
        net, (x,) = network(X)
        a = conv(net, x, 4, "conv_a", bias=True, activation={"type": "relu"})
        b = conv(net, x, 2, "conv_b", activation={"type": "relu"})
        net.mark_output(add(net, "Unary", [a], "out", op="abs"))
        net.mark_output(b, name="b_out")
        return net

    engine = build_and_compare(make, [rand(*X)])
    assert layer_names(engine) == ["conv_a + conv_b", "conv_a (split)", "conv_b (split)", "out"]
    fused = layer(engine, "conv_a + conv_b")
    assert fused.outputs[0].shape == (2, 6, 6, 6) and fused.weights["bias"].shape == (6,)
    assert [t.name for t in engine.outputs] == ["out:0", "b_out"]


def test_matrix_multiplies_with_constant_b_merge():
    def make():
        net, (x,) = network((4, 5))
        for name, n in (("q", 3), ("k", 3), ("v", 2)):
            net.mark_output(matmul(net, x, n, name, transpose_b=True))
        return net

    engine = build_and_compare(make, [rand(4, 5)])
    assert layer_names(engine) == ["q + k + v", "q (split)", "k (split)", "v (split)"]


def test_different_windows_or_activations_do_not_merge():
    def make():
        net, (x,) = network(X)
        net.mark_output(conv(net, x, 4, "a"))
        net.mark_output(conv(net, x, 4, "b", stride=2))
        net.mark_output(conv(net, x, 4, "c", k=1))
        net.mark_output(conv(net, x, 4, "d", activation={"type": "relu"}))
        return net

    assert layer_names(build_and_compare(make, [rand(*X)])) == ["a", "b", "c", "d"]


def test_the_fused_output_takes_the_largest_range_where_every_sibling_has_one():
    """One per-tensor scale covering each sibling's values (an INT8 Attention reads a fused QKV output in place);
    the Slices keep their own ranges."""
    def make(v_range):
        def build():
            net, (x,) = network((4, 5))
            for name, r in (("q", 1.0), ("k", 3.0), ("v", v_range)):
                y = matmul(net, x, 3, name)
                y.dynamic_range = r
                net.mark_output(y)
            return net
        return build

    engine = build_and_compare(make(2.0), [rand(4, 5)])
    assert layer(engine, "q + k + v").outputs[0].dynamic_range == 3.0
    assert [t.dynamic_range for t in engine.outputs] == [1.0, 3.0, 2.0]
    assert layer(build_and_compare(make(None), [rand(4, 5)]), "q + k + v").outputs[0].dynamic_range is None


@pytest.mark.skipif(not available()[0], reason=available()[1])
def test_a_backend_keeps_apart_the_kinds_it_runs_faster_apart():
    """ONNX Runtime (horizontal_kinds: MatrixMultiply only) keeps sibling convolutions apart, merges projections."""
    def make():
        net, (x, y) = network(X, (4, 5))
        net.mark_output(conv(net, x, 4, "conv_a"))
        net.mark_output(conv(net, x, 2, "conv_b"))
        for name, n in (("q", 3), ("k", 3)):
            net.mark_output(matmul(net, y, n, name, transpose_b=True))
        return net

    engine = Builder(BuilderConfig(backend="onnxruntime")).build_engine(make())
    assert layer_names(engine) == ["conv_a", "conv_b", "q + k", "q (split)", "k (split)"]
