"""MLP fusion: chains of 2-d matrix multiplies with biases and activations as one MLP layer."""
import numpy as np
import pytest

from fusion_nets import add, build_and_compare, const, layer, layer_names, matmul, network, rand
from tftrt_py.engine import Network, NetworkError, Runtime
from tftrt_py.engine.builder.fusions import mlp
from tftrt_py.engine.builder.fusions.mlp import MAX_LAYERS


def test_dense_relu_dense_becomes_a_two_layer_mlp():
    def make():
        net, (x,) = network((4, 6))
        h = add(net, "ElementWise", [matmul(net, x, 8, "ip1"), const(net, rand(8), "b1")], "bias1", op="sum")
        h = matmul(net, add(net, "Activation", [h], "relu1", type="relu"), 3, "ip2", transpose_b=True)
        net.mark_output(add(net, "Scale", [h], "bias2", {"shift": rand(3)}, channel_axis=1))
        return net

    engine = build_and_compare(make, [rand(4, 6)])
    assert layer_names(engine) == ["ip1 + bias1 + relu1 + ip2 + bias2"]
    mlp = layer(engine, "ip1 + bias1 + relu1 + ip2 + bias2")
    assert mlp.kind == "MLP" and mlp.params["activations"] == [{"type": "relu"}, None]
    assert sorted(mlp.weights) == ["b0", "b1", "w0", "w1"] and mlp.weights["w1"].shape == (8, 3)


def test_two_matrix_multiplies_with_nothing_between_merge():
    def make():
        net, (x,) = network((4, 6))
        net.mark_output(add(net, "Activation", [matmul(net, matmul(net, x, 8, "a"), 2, "b")], "tanh", type="tanh"))
        return net

    engine = build_and_compare(make, [rand(4, 6)])
    assert [(l.name, l.kind) for l in engine.network.layers] == [("a + b + tanh", "MLP")]


def test_at_most_31_layers():
    def make():
        net, (x,) = network((2, 4))
        for i in range(MAX_LAYERS + 1):
            x = add(net, "Activation", [matmul(net, x, 4, f"fc{i}")], f"relu{i}", type="relu")
        net.mark_output(x)
        return net

    engine = build_and_compare(make, [rand(2, 4)])
    layers = [l for l in engine.network.layers if l.kind != "Constant"]
    assert [l.kind for l in layers] == ["MLP", "MatrixMultiply"]
    assert len(layers[0].params["activations"]) == MAX_LAYERS


def test_near_misses_stay_matrix_multiplies():
    def make():
        net, (x, y) = network((4, 6), (2, 4, 6))
        a = matmul(net, x, 8, "a")  # a's output is also read elsewhere
        net.mark_output(matmul(net, a, 3, "a2"))
        net.mark_output(add(net, "Unary", [a], "abs", op="abs"))
        b = add(net, "MatrixMultiply", [y, const(net, rand(6, 5), "w")], "batched")  # not 2-d
        net.mark_output(matmul(net, add(net, "Shuffle", [b], "flat", reshape=[8, 5]), 3, "b2"))
        c = add(net, "MatrixMultiply", [x, add(net, "Shuffle", [y], "w2", reshape=[6, 8])], "c")  # B not constant
        net.mark_output(matmul(net, c, 2, "c2"))
        return net

    engine = build_and_compare(make, [rand(4, 6), rand(2, 4, 6)])
    assert "MLP" not in [l.kind for l in engine.network.layers]


def test_mlp_layer_kind_checks_its_weights():
    net = Network()
    x = net.add_input("x", "float32", (2, 3))
    params = {"activations": [None, {"type": "relu"}]}
    ok = {"w0": np.ones((3, 4), "float32"), "b0": np.ones(4, "float32"), "w1": np.ones((4, 2), "float32"),
          "b1": np.ones(2, "float32")}
    assert net.add_layer("MLP", [x], params, ok).outputs[0].shape == (2, 2)
    with pytest.raises(NetworkError, match="do not follow width 4"):
        net.add_layer("MLP", [x], params, dict(ok, w1=np.ones((5, 2), "float32")))


def test_an_mlp_survives_a_plan_round_trip():
    def make():
        net, (x,) = network((4, 6))
        net.mark_output(matmul(net, add(net, "Activation", [matmul(net, x, 8, "a")], "elu", type="elu", alpha=0.5),
                               2, "b"))
        return net

    engine = build_and_compare(make, [rand(4, 6)])
    loaded = Runtime().deserialize_cuda_engine(engine.serialize())
    x = rand(4, 6)
    assert [l.kind for l in loaded.network.layers] == ["MLP"]
    np.testing.assert_array_equal(loaded.create_execution_context().execute_v2([x])[0],
                                  engine.create_execution_context().execute_v2([x])[0])


def test_weights_over_the_size_limit_stay_out(monkeypatch):
    monkeypatch.setattr(mlp, "MAX_WEIGHT_ELEMENTS", 40)

    def make():
        net, (x,) = network((4, 6))
        net.mark_output(matmul(net, matmul(net, matmul(net, x, 8, "big"), 4, "small1"), 2, "small2"))
        return net

    assert layer_names(build_and_compare(make, [rand(4, 6)])) == ["big", "small1 + small2"]
