"""The Attention and Normalization layer kinds: shape rules, numpy kernels (fp32 math, FP16 as the GPU rounds),
row-wise batches and plans."""
import numpy as np
import pytest

from tftrt_py.engine import Builder, BuilderConfig, Engine, Network, NetworkError, Runtime
from tftrt_py.engine.quantization import round_fp16

RNG = np.random.default_rng(5)


def rand(*shape):
    return RNG.standard_normal(shape).astype("float32")


def single(kind, shapes, params, weights=None, dtype="float32"):
    net = Network(kind)
    inputs = [net.add_input(f"x{i}", dtype, s) for i, s in enumerate(shapes)]
    net.mark_output(net.add_layer(kind, inputs, params, weights, name=kind.lower()).outputs[0], name="y")
    return net


def run(net, arrays, precision="FP32"):
    engine = Builder(BuilderConfig(precision=precision)).build_engine(net)
    return engine.create_execution_context().execute_v2(arrays)[0]


def attention_reference(q, k, v, scale, heads):
    """Head by head in float64, each head's columns of the packed tensors (heads None: one head)."""
    q, k, v = (a.astype(np.float64) for a in (q, k, v))
    h = heads or 1
    d, dv = q.shape[-1] // h, v.shape[-1] // h
    out = []
    for i in range(h):
        s = q[..., i * d:(i + 1) * d] @ np.swapaxes(k[..., i * d:(i + 1) * d], -1, -2) * scale
        p = np.exp(s - s.max(-1, keepdims=True))
        out.append(p / p.sum(-1, keepdims=True) @ v[..., i * dv:(i + 1) * dv])
    return np.concatenate(out, axis=-1)


def layer_norm_reference(x, scale, bias, eps, residual=None):
    s = x.astype(np.float64) + (0 if residual is None else residual)
    return (s - s.mean(-1, keepdims=True)) / np.sqrt(s.var(-1, keepdims=True) + eps) * scale + bias


ATTENTION = {  # q, k, v shapes and heads
    "one head": ([(2, 5, 8), (2, 7, 8), (2, 7, 3)], None),
    "head axis": ([(2, 3, 5, 8), (2, 3, 7, 8), (2, 3, 7, 4)], None),
    "packed": ([(2, 5, 4 * 8), (2, 7, 4 * 8), (2, 7, 4 * 8)], 4),
    "packed, narrow v": ([(3, 6, 2 * 8), (3, 6, 2 * 8), (3, 6, 2 * 3)], 2),
}


@pytest.mark.parametrize("case", sorted(ATTENTION))
def test_attention_matches_head_by_head_softmax(case):
    shapes, heads = ATTENTION[case]
    arrays = [rand(*s) * 3 for s in shapes]
    got = run(single("Attention", shapes, {"scale": 0.3, "heads": heads}), arrays)
    assert got.shape == (*shapes[0][:-1], shapes[2][-1]) and got.dtype == np.float32
    np.testing.assert_allclose(got, attention_reference(*arrays, 0.3, heads), rtol=1e-5, atol=1e-6)


def test_attention_reads_column_windows_of_wider_inputs():
    qkv = rand(2, 5, 3 * 16) * 3
    columns = [[0, 16], [16, 16], [32, 16]]
    got = run(single("Attention", [(2, 5, 48)] * 3, {"scale": 0.3, "heads": 2, "columns": columns}), [qkv] * 3)
    want = attention_reference(qkv[..., :16], qkv[..., 16:32], qkv[..., 32:], 0.3, 2)
    assert got.shape == (2, 5, 16)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_attention_softmax_is_stable():
    q, k, v = rand(1, 2, 4), rand(1, 3, 4), rand(1, 3, 2)
    got = run(single("Attention", [(1, 2, 4), (1, 3, 4), (1, 3, 2)], {"scale": 1e4, "heads": None}), [q, k, v])
    assert np.all(np.isfinite(got))
    np.testing.assert_allclose(got, attention_reference(q, k, v, 1e4, None), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("residual", [False, True])
def test_normalization_matches_layer_norm(residual):
    shape = (3, 4, 40)
    weights = {"scale": rand(40), "bias": rand(40)}
    arrays = [rand(*shape) * 5 + 3 for _ in range(1 + residual)]
    got = run(single("Normalization", [shape] * len(arrays), {"epsilon": 1e-3}, weights), arrays)
    np.testing.assert_allclose(got, layer_norm_reference(*arrays[:1], weights["scale"], weights["bias"], 1e-3,
                                                         *arrays[1:]), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind, shapes, params, weights", [
    ("Attention", [(2, 5, 8), (2, 7, 8), (2, 7, 3)], {"scale": 0.5, "heads": None}, None),
    ("Normalization", [(2, 5, 8), (2, 5, 8)], {"epsilon": 1e-5}, {"scale": np.full(8, 1.5, "float32"),
                                                                     "bias": np.full(8, 0.25, "float32")}),
])
def test_fp16_rounds_inputs_weights_and_outputs_and_computes_in_fp32(kind, shapes, params, weights):
    arrays = [rand(*s) for s in shapes]
    got = run(single(kind, shapes, params, weights), arrays, "FP16")
    want = run(single(kind, shapes, params, weights), [round_fp16(a) for a in arrays])
    np.testing.assert_array_equal(got, round_fp16(want))
    half = run(single(kind, shapes, params, weights, dtype="float16"), [a.astype("float16") for a in arrays], "FP16")
    assert half.dtype == np.float16
    np.testing.assert_array_equal(half, got.astype("float16"))


@pytest.mark.parametrize("kind, shapes, params, weights, match", [
    ("Attention", [(2, 5, 8), (2, 7, 8), (2, 6, 8)], {"scale": 1.0}, None, "Sk"),
    ("Attention", [(2, 5, 8), (3, 7, 8), (3, 7, 8)], {"scale": 1.0}, None, "Sk"),
    ("Attention", [(5, 8), (7, 8), (7, 8)], {"scale": 1.0}, None, "rank >= 3"),
    ("Attention", [(2, 5, 8), (2, 7, 8), (2, 7, 8)], {"scale": 1.0, "heads": 3}, None, "heads"),
    ("Attention", [(2, 2, 5, 8), (2, 2, 7, 8), (2, 2, 7, 8)], {"scale": 1.0, "heads": 2}, None, "rank-3"),
    ("Attention", [(2, 5, 8), (2, 7, 8), (2, 7, 8)], {"scale": "1"}, None, "not a number"),
    ("Attention", [(2, 5, 24)] * 3, {"scale": 1.0, "heads": 2, "columns": [[0, 8], [8, 8], [20, 8]]}, None,
     "windows"),
    ("Attention", [(2, 5, 24)] * 3, {"scale": 1.0, "heads": None, "columns": [[0, 8], [8, 8], [16, 8]]}, None,
     "windows"),
    ("Normalization", [(2, 8), (1, 8)], {"epsilon": 1e-5}, {"scale": np.ones(8), "bias": np.ones(8)}, "residual"),
    ("Normalization", [(2, 8)], {"epsilon": 1e-5}, {"scale": np.ones(8), "bias": np.ones(2)}, "bias has shape"),
])
def test_shape_rules_reject(kind, shapes, params, weights, match):
    with pytest.raises(NetworkError, match=match):
        single(kind, shapes, params, weights)


@pytest.mark.parametrize("kind, shapes, params, weights", [
    ("Attention", [(4, 5, 2 * 8)] * 3, {"scale": 0.3, "heads": 2}, None),
    ("Normalization", [(4, 5, 8)] * 2, {"epsilon": 1e-5}, {"scale": np.ones(8, "float32"),
                                                           "bias": np.zeros(8, "float32")}),
])
def test_smaller_batches_are_served_and_plans_round_trip(kind, shapes, params, weights):
    engine = Engine(single(kind, shapes, params, weights))
    arrays = [rand(*s) for s in shapes]
    full = engine.create_execution_context().execute_v2(arrays)[0]
    assert engine.rowwise
    np.testing.assert_array_equal(engine.create_execution_context().execute_v2([a[:2] for a in arrays])[0], full[:2])
    loaded = Runtime().deserialize_cuda_engine(engine.serialize())
    assert loaded.network.layers[0].params == params
    np.testing.assert_array_equal(loaded.create_execution_context().execute_v2(arrays)[0], full)


def test_constant_keys_or_residual_mix_rows():
    net = Network()
    q = net.add_input("q", "float32", (2, 5, 8))
    k = net.add_constant(rand(2, 7, 8))
    net.mark_output(net.add_layer("Attention", [q, k, k], {"scale": 1.0, "heads": None}).outputs[0])
    assert not Engine(net).rowwise
    net = Network()
    x = net.add_input("x", "float32", (2, 8))
    weights = {"scale": np.ones(8, "float32"), "bias": np.zeros(8, "float32")}
    net.mark_output(net.add_layer("Normalization", [x, net.add_constant(rand(2, 8))], {"epsilon": 1e-5},
                                  weights).outputs[0])
    assert not Engine(net).rowwise
