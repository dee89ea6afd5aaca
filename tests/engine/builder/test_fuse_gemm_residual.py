"""Residual sums fused into the MatrixMultiply or MLP producing one of their operands (pre-norm blocks)."""
import numpy as np
import pytest

from fusion_nets import add, build_and_compare, layer, layer_names, matmul, network, rand
from tftrt_py.engine import Builder, BuilderConfig, Network, NetworkError

B, S, H = 2, 5, 8


def _layer_norm(net, x, name):
    """LayerNorm over the last axis as TF writes it: (x - mean) * rsqrt(var + eps) * gamma + beta."""
    mean = add(net, "Reduce", [x], f"{name}/mean", op="mean", axes=[-1], keep_dims=True)
    centered = add(net, "ElementWise", [x, mean], f"{name}/sub", op="sub")
    var = add(net, "Reduce", [add(net, "ElementWise", [centered, centered], f"{name}/sq", op="prod")], f"{name}/var",
              op="mean", axes=[-1], keep_dims=True)
    eps = net.add_constant(np.full((), 1e-5, "float32"), name=f"{name}/eps")
    r = add(net, "Unary", [add(net, "ElementWise", [var, eps], f"{name}/add", op="sum")], f"{name}/rsqrt", op="rsqrt")
    return add(net, "ElementWise", [centered, r], f"{name}/norm", op="prod")


def _pre_norm_block(net, x, i):
    """x + dense(LN(x)) over [B*S, H] rows, as Keras's Tensordot reshapes: the sum feeds the next LN and sum."""
    rows = add(net, "Shuffle", [_layer_norm(net, x, f"ln{i}")], f"rows{i}", reshape=[-1, H])
    h = matmul(net, rows, H, f"dense{i}")
    return add(net, "ElementWise", [x, add(net, "Shuffle", [h], f"unrows{i}", reshape=[-1, S, H])], f"add{i}", op="sum")


def test_pre_norm_sums_go_into_the_dense_layers_before_them():
    def make():
        net, (x,) = network((B, S, H))
        y = _pre_norm_block(net, _pre_norm_block(net, x, 0), 1)
        net.mark_output(add(net, "Activation", [y], "out", type="tanh"))
        return net

    engine = build_and_compare(make, [rand(B, S, H)])
    names = layer_names(engine)
    assert "add0" not in names and "add1" not in names
    fused = layer(engine, "dense1 + unrows1 + add1 + out_1")  # the tanh then moved before the reshape and fused
    assert fused.kind == "MatrixMultiply" and len(fused.inputs) == 3 and fused.params["activation"] == {"type": "tanh"}
    assert fused.inputs[2].shape == (B * S, H) and fused.inputs[2].producer.params["reshape"] == [-1, H]


def test_a_sum_a_layer_norm_reads_alone_stays_with_the_normalization():
    """Post-norm (BERT): LN(x + dense(x)) keeps the sum as the Normalization's residual."""
    def make():
        net, (x,) = network((B * S, H))
        net.mark_output(_layer_norm(net, add(net, "ElementWise", [x, matmul(net, x, H, "dense")], "add", op="sum"),
                                    "ln"))
        return net

    engine = build_and_compare(make, [rand(B * S, H)])
    norm = next(l for l in engine.network.layers if l.kind == "Normalization")
    assert len(norm.inputs) == 2 and layer(engine, "dense").kind == "MatrixMultiply"
    assert len(layer(engine, "dense").inputs) == 2


def test_an_mlp_takes_the_sum_after_its_last_layer():
    def make():
        net, (x,) = network((B * S, H))
        h = add(net, "Activation", [matmul(net, x, 2 * H, "fc1")], "gelu", type="gelu_tanh")
        y = add(net, "ElementWise", [matmul(net, h, H, "fc2"), x], "add", op="sum")
        net.mark_output(add(net, "Unary", [y], "abs", op="abs"))
        net.mark_output(y)
        return net

    engine = build_and_compare(make, [rand(B * S, H)], rtol=1e-4, atol=1e-5)
    mlp = next(l for l in engine.network.layers if l.kind == "MLP")
    assert [t.name for t in mlp.inputs] == ["x0", "x0"] and mlp.params["activations"] == [{"type": "gelu_tanh"},
                                                                                          None]
    assert engine.network.outputs[1].producer is mlp  # the sum was an output: the MLP makes it, named as before


def test_the_residual_is_added_after_the_bias_and_before_the_activation():
    def make():
        net, (x, r) = network((4, H), (4, H))
        y = add(net, "Scale", [matmul(net, x, H, "dense")], "bias", {"shift": rand(H)}, channel_axis=1)
        y = add(net, "ElementWise", [y, r], "add", op="sum")
        net.mark_output(add(net, "Activation", [y], "relu", type="relu"))
        return net

    engine = build_and_compare(make, [rand(4, H), rand(4, H)])
    assert layer_names(engine) == ["dense + bias + add + relu"]
    fused = layer(engine, "dense + bias + add + relu")
    assert [t.name for t in fused.inputs[::2]] == ["x0", "x1"] and fused.params["activation"] == {"type": "relu"}
    assert "bias" in fused.weights


def test_near_misses_keep_the_sum():
    def make():
        net, (x, wide) = network((4, H), (4, 2 * H))
        relu = matmul(net, x, H, "relu_dense", activation={"type": "relu"})  # the activation precedes the sum
        net.mark_output(add(net, "ElementWise", [relu, x], "after_relu", op="sum"))
        shared = matmul(net, x, H, "shared_dense")  # the product has a second reader
        net.mark_output(add(net, "ElementWise", [shared, x], "shared", op="sum"))
        net.mark_output(add(net, "Unary", [shared], "abs", op="abs"))
        row = add(net, "Reduce", [x], "row", op="mean", axes=[1], keep_dims=True)  # r broadcasts
        net.mark_output(add(net, "ElementWise", [matmul(net, x, H, "bcast_dense"), row], "broadcast", op="sum"))
        t = add(net, "Shuffle", [matmul(net, x, H, "t_dense")], "transpose", first_perm=[1, 0])  # not a reshape
        net.mark_output(add(net, "ElementWise", [t, add(net, "Shuffle", [x], "xt", first_perm=[1, 0])], "transposed",
                            op="sum"))
        net.mark_output(add(net, "ElementWise", [matmul(net, x, H, "diff_dense"), x], "difference", op="sub"))
        net.mark_output(wide)
        return net

    names = layer_names(build_and_compare(make, [rand(4, H), rand(4, 2 * H)]))
    assert {"after_relu", "shared", "broadcast", "transposed", "difference"} <= set(names)


def test_a_residual_dense_layer_stays_fp16_in_int8_engines():
    """Quantized GEMM kernels take no residual: that MatrixMultiply is not an int8 candidate."""
    net, (x,) = network((B, S, H))
    y = _pre_norm_block(net, x, 0)
    net.mark_output(y)
    for t in [x] + [t for l in net.layers for t in l.outputs]:
        t.dynamic_range = 4.0
    engine = Builder(BuilderConfig(precision="INT8")).build_engine(net)
    (dense,) = [l for l in engine.network.layers if l.kind == "MatrixMultiply"]
    assert len(dense.inputs) == 3 and dense.precision == "FP16"


@pytest.mark.parametrize("kind, inputs", [("MatrixMultiply", [(4, 6), (6, 3), (4, 2)]), ("MLP", [(4, 6), (4, 2)])])
def test_a_residual_unlike_the_output_is_refused(kind, inputs):
    net = Network("bad")
    ts = [net.add_input(f"x{i}", "float32", s) for i, s in enumerate(inputs)]
    weights = {"w0": np.ones((6, 3), "float32"), "b0": np.zeros(3, "float32")} if kind == "MLP" else None
    params = {"activations": [None]} if kind == "MLP" else {}
    with pytest.raises(NetworkError, match="residual"):
        net.add_layer(kind, ts, params, weights)
