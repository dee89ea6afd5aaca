"""Activations fused into Convolution, MatrixMultiply and Scale."""
import numpy as np
import pytest

from fusion_nets import add, build_and_compare, conv, layer, layer_names, matmul, network, rand

X = (2, 5, 5, 3)
EPILOGUE = [dict(type="relu"), dict(type="relu6"), dict(type="leaky_relu", alpha=0.2), dict(type="elu", alpha=0.7),
            dict(type="sigmoid"), dict(type="tanh"), dict(type="gelu_erf"), dict(type="gelu_tanh"), dict(type="swish"),
            dict(type="clip", alpha=-0.5, beta=0.5)]


@pytest.mark.parametrize("activation", EPILOGUE, ids=lambda a: a["type"])
def test_convolution_and_matrix_multiply_take_the_activation(activation):
    def make():
        net, (x, a) = network(X, (4, 6))
        net.mark_output(add(net, "Activation", [conv(net, x, 4, "conv", bias=True)], "act", **activation))
        net.mark_output(add(net, "Activation", [matmul(net, a, 3, "mm")], "mm_act", **activation))
        return net

    engine = build_and_compare(make, [rand(*X), rand(4, 6)])
    assert layer_names(engine) == ["conv + act", "mm + mm_act"]
    assert layer(engine, "conv + act").params["activation"] == activation


def test_scale_takes_any_activation_but_convolution_only_its_own():
    def make():
        net, (x,) = network(X)
        y = add(net, "Scale", [x], "scale", {"scale": rand(3), "shift": rand(3)})
        net.mark_output(add(net, "Activation", [y], "selu", type="selu"))
        net.mark_output(add(net, "Activation", [conv(net, x, 4, "conv")], "softplus", type="softplus"))
        return net

    engine = build_and_compare(make, [rand(*X)])
    assert layer_names(engine) == ["scale + selu", "conv", "softplus"]
    assert layer(engine, "scale + selu").kind == "Scale"


def test_scale_folds_into_the_convolution_before_the_activation_fuses():
    def make():
        net, (x,) = network(X)
        y = add(net, "Scale", [conv(net, x, 4, "conv")], "bn", {"scale": rand(4), "shift": rand(4)})
        net.mark_output(add(net, "Activation", [y], "relu", type="relu"))
        return net

    engine = build_and_compare(make, [rand(*X)])
    assert layer_names(engine) == ["conv + bn + relu"]


def test_an_activation_is_not_fused_when_its_input_has_another_reader_or_is_an_output():
    def make():
        net, (x,) = network(X)
        a = conv(net, x, 4, "a")
        net.mark_output(add(net, "Activation", [a], "relu_a", type="relu"))
        net.mark_output(add(net, "Unary", [a], "abs", op="abs"))
        b = conv(net, x, 4, "b", k=1)  # (not the same kernel size as a: no horizontal fusion)
        net.mark_output(b)
        net.mark_output(add(net, "Activation", [b], "relu_b", type="relu"))
        return net

    names = layer_names(build_and_compare(make, [rand(*X)]))
    assert {"a", "relu_a", "b", "relu_b"} <= set(names)


def test_a_second_activation_stays_separate():
    def make():
        net, (x,) = network(X)
        y = add(net, "Activation", [conv(net, x, 4, "conv")], "relu", type="relu")
        net.mark_output(add(net, "Activation", [y], "tanh", type="tanh"))
        return net

    assert layer_names(build_and_compare(make, [rand(*X)])) == ["conv + relu", "tanh"]


def test_fused_output_keeps_the_binding_name():
    def make():
        net, (x,) = network(X)
        net.mark_output(add(net, "Activation", [conv(net, x, 4, "conv")], "relu", type="relu"), name="out")
        return net

    engine = build_and_compare(make, [rand(*X)])
    assert [t.name for t in engine.outputs] == ["out"]
    out = engine.create_execution_context().execute({"x0": np.ones(X, "float32")})["out"]
    assert out.min() >= 0


def test_an_activation_behind_a_reshape_moves_before_it_and_fuses():
    """Keras's Tensordot: [B*S, K] x W -> reshape [B, S, N] -> GELU -> reshape [B*S, N] -> x W2. The GELU moves
    before the reshape into the first GEMM; the reshapes cancel and both GEMMs form one MLP."""
    def make():
        net, (x,) = network((6, 8))
        h = add(net, "Shuffle", [matmul(net, x, 16, "dense1")], "unflatten", reshape=[2, 3, 16])
        h = add(net, "Activation", [h], "gelu", type="gelu_tanh")
        net.mark_output(matmul(net, add(net, "Shuffle", [h], "flatten", reshape=[6, 16]), 4, "dense2"))
        return net

    engine = build_and_compare(make, [rand(6, 8)])
    (mlp,) = [l for l in engine.network.layers if l.kind != "Constant"]
    assert mlp.kind == "MLP" and mlp.params["activations"] == [{"type": "gelu_tanh"}, None]


def test_a_bias_and_its_gelu_behind_a_reshape_move_before_it_and_fold():
    """Keras's Dense on [B, S, K] (ViT's MLP): reshape, then BiasAdd and the erf GELU on [B, S, N] (the GELU fuses into
    the bias Scale first). The Scale moves before the reshape (it keeps the channels) and folds into the GEMM with
    its activation: one MLP."""
    def make():
        net, (x,) = network((6, 8))
        h = add(net, "Shuffle", [matmul(net, x, 16, "dense1")], "unflatten", reshape=[2, 3, 16])
        h = add(net, "Scale", [h], "bias1", {"shift": rand(16)}, channel_axis=2)
        h = add(net, "Activation", [h], "gelu", type="gelu_erf")
        h = add(net, "Shuffle", [h], "flatten", reshape=[6, 16])
        h = add(net, "Shuffle", [matmul(net, h, 4, "dense2")], "unflatten2", reshape=[2, 3, 4])
        net.mark_output(add(net, "Scale", [h], "bias2", {"shift": rand(4)}, channel_axis=2))
        return net

    engine = build_and_compare(make, [rand(6, 8)], rtol=1e-4)
    (mlp, reshape) = [l for l in engine.network.layers if l.kind != "Constant"]
    assert mlp.kind == "MLP" and mlp.params["activations"] == [{"type": "gelu_erf"}, None]
    assert reshape.kind == "Shuffle" and np.any(mlp.weights["b1"] != 0)


@pytest.mark.parametrize("near_miss", ["scaled", "last_axis_changes", "transposed"])
def test_a_scale_behind_a_reshape_stays_where_moving_it_would_not_fold(near_miss):
    def make():
        net, (x,) = network((6, 8))
        y = matmul(net, x, 16, "dense")
        if near_miss == "transposed":
            y = add(net, "Shuffle", [y], "shuffle", first_perm=[1, 0])
        else:
            y = add(net, "Shuffle", [y], "shuffle", reshape=[2, 3, 16] if near_miss == "scaled" else [6, 4, 4])
        channels = y.shape[-1]
        weights = {"shift": rand(channels)}
        if near_miss == "scaled":
            weights["scale"] = rand(channels, positive=True)
        net.mark_output(add(net, "Scale", [y], "bias", weights, channel_axis=len(y.shape) - 1))
        return net

    engine = build_and_compare(make, [rand(6, 8)])
    assert [l.kind for l in engine.network.layers if l.kind != "Constant"] == ["MatrixMultiply", "Shuffle", "Scale"]


def test_an_activation_behind_a_transpose_moves_too_unless_the_transpose_is_read_elsewhere():
    def make(read_elsewhere):
        net, (x,) = network((6, 8))
        h = add(net, "Shuffle", [matmul(net, x, 16, "dense1")], "transpose", first_perm=[1, 0])
        net.mark_output(add(net, "Activation", [h], "relu", type="relu"))
        if read_elsewhere:
            net.mark_output(add(net, "Unary", [h], "abs", op="abs"))
        return net

    engine = build_and_compare(lambda: make(False), [rand(6, 8)])
    first, second = [l for l in engine.network.layers if l.kind != "Constant"]
    assert (first.kind, first.params["activation"], second.kind) == ("MatrixMultiply", {"type": "relu"}, "Shuffle")
    engine = build_and_compare(lambda: make(True), [rand(6, 8)])
    assert [l.kind for l in engine.network.layers if l.kind != "Constant"] == ["MatrixMultiply", "Shuffle",
                                                                              "Activation", "Unary"]
