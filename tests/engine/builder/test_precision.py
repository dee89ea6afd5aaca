"""The precision pass (which layers run in FP32, FP16, INT8) and how the numpy backend computes FP16 and
INT8 layers (as the GPU does)."""
import logging

import numpy as np
import pytest

from fusion_nets import add, const, conv, rand
from networks import quantized_attention_net
from tftrt_py.engine import Builder, BuilderConfig, Network, Runtime
from tftrt_py.engine import quantization
from tftrt_py.engine.backends import threads
from tftrt_py.engine.builder import precision
from tftrt_py.engine.errors import MissingDynamicRangeError
from tftrt_py.engine.plan import read_header


def build(net, mode):
    return Builder(BuilderConfig(precision=mode)).build_engine(net)


def precisions(engine):
    return {layer.name: layer.precision for layer in engine.network.layers}


def classifier(batch=4, with_ranges=False):
    """x [batch, 8, 8, 3] -> conv (relu) -> flatten -> matmul -> softmax (logits of a few units), and
    ranges for x and the flattened activation when asked. Same weights at every call."""
    rng = np.random.default_rng(0)
    w = lambda *shape: rng.standard_normal(shape).astype("float32")
    net = Network("classifier")
    x = net.add_input("TensorRTInputPH_0", "float32", (batch, 8, 8, 3))
    weights = {"kernel": w(3, 3, 3, 4) * 0.3, "bias": w(4) * 0.1}
    y = add(net, "Convolution", [x], "conv", weights, strides=[1, 1], dilations=[1, 1], pre_padding=[1, 1],
            post_padding=[1, 1], groups=1, activation={"type": "relu"})
    y = add(net, "Shuffle", [y], "flatten", reshape=[batch, -1])
    logits = add(net, "MatrixMultiply", [y, const(net, w(256, 10) * 0.1, "dense/b")], "dense")
    probs = add(net, "Softmax", [logits], "softmax", axis=-1)
    net.mark_output(probs, "TensorRTOutputPH_0")
    net.mark_output(logits, "TensorRTOutputPH_1")
    if with_ranges:
        x.dynamic_range, y.dynamic_range = 3.0, 6.0
    return net


# -- the pass ---------------------------------------------------------------------------------------
def test_fp32_runs_everything_in_fp32():
    assert set(precisions(build(classifier(), "FP32")).values()) == {"FP32", None}


def test_fp16_keeps_softmax_in_fp32_and_logs_its_choices(caplog):
    with caplog.at_level(logging.DEBUG, logger="tftrt_py.engine.builder.precision"):
        engine = build(classifier(), "FP16")
    got = precisions(engine)
    assert got["softmax"] == "FP32" and got["conv"] == "FP16" and got["dense"] == "FP16" and got["flatten"] == "FP16"
    assert got["dense/b"] is None  # constants hold weights: no precision
    info = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert any("precision of classifier (FP16): 3 FP16, 1 FP32; fp32 for softmax sums x1" in m for m in info)
    debug = [r.getMessage() for r in caplog.records if r.levelno == logging.DEBUG]
    assert any("layer 'softmax' (Softmax) runs in FP32 (softmax sums)" in m for m in debug)
    assert any("layer 'conv' (Convolution) runs in FP16" in m for m in debug)


@pytest.mark.parametrize("kind, inputs, params, reason", [
    ("Unary", 1, {"op": "exp"}, "exp/log"),
    ("Unary", 1, {"op": "log"}, "exp/log"),
    ("Unary", 1, {"op": "rsqrt"}, "normalization statistics"),
    ("Unary", 1, {"op": "abs"}, None),
    ("ElementWise", 2, {"op": "pow"}, "pow"),
    ("ElementWise", 2, {"op": "squared_difference"}, "normalization statistics"),
    ("ElementWise", 2, {"op": "sum"}, None),
    ("Reduce", 1, {"op": "sum", "axes": [1, 2, 3], "keep_dims": False}, "large reduction (300 elements)"),
    ("Reduce", 1, {"op": "mean", "axes": [3], "keep_dims": False}, None),
    ("Reduce", 1, {"op": "max", "axes": [1, 2, 3], "keep_dims": False}, None),
    ("Reduce", 1, {"op": "l2", "axes": [3], "keep_dims": False}, "normalization statistics"),
    ("Reduce", 1, {"op": "log_sum_exp", "axes": [3], "keep_dims": False}, "exp/log"),
    ("Softmax", 1, {"axis": -1}, "softmax sums"),
    ("Identity", 1, {"dtype": "int32"}, "cast"),
    ("Identity", 1, {}, None),
    ("Activation", 1, {"type": "sigmoid"}, None),
])
def test_fp32_rules(kind, inputs, params, reason):
    net = Network("n")
    xs = [net.add_input(f"x{i}", "float32", (2, 10, 10, 3)) for i in range(inputs)]
    layer = net.add_layer(kind, xs, params)
    assert precision.fp32_reason(layer) == reason


def test_integer_layers_are_exact():
    net = Network("n")
    layer = net.add_layer("ElementWise", [net.add_input(f"x{i}", "int32", (4,)) for i in range(2)], {"op": "sum"})
    assert precision.fp32_reason(layer) == "no float data"


def test_int8_runs_convolution_and_matmul_in_int8_and_the_rest_in_fp16():
    got = precisions(build(classifier(with_ranges=True), "INT8"))
    assert (got["conv"], got["dense"], got["flatten"], got["softmax"]) == ("INT8", "INT8", "FP16", "FP32")


def test_int8_names_the_tensors_that_lack_a_range():
    net = classifier()
    net.inputs[0].dynamic_range = 3.0  # the flattened activation has none
    with pytest.raises(MissingDynamicRangeError, match=r"no quantization range for tensor\(s\) flatten:0 "
                                                       r"\(read by int8 layer\(s\) dense\)") as info:
        build(net, "INT8")
    assert info.value.tensors == ["flatten:0"]


def test_int8_without_any_range_builds_fp16_with_a_warning(caplog):
    engine = build(classifier(), "INT8")
    assert set(precisions(engine).values()) == {"FP16", "FP32", None}
    assert "no tensor has a dynamic range" in caplog.text


def test_ranges_follow_fused_tensors_and_the_name_shown_is_the_graphs():
    net = Network("n")
    x = net.add_input("TensorRTInputPH_0", "float32", (2, 6, 6, 3))
    y = conv(net, x, 4, "conv1/Conv2D")
    y = add(net, "Activation", [y], "conv1/Relu", type="relu")
    y.dynamic_range = 5.0  # fused into conv1's output: the range moves with it
    z = conv(net, y, 4, "conv2/Conv2D")
    z = add(net, "Activation", [z], "conv2/Relu", type="relu")
    w = conv(net, z, 4, "conv3/Conv2D")
    net.mark_output(w, "TensorRTOutputPH_0")
    x.dynamic_range = 1.0
    with pytest.raises(MissingDynamicRangeError) as info:
        build(net, "INT8")
    assert info.value.tensors == ["conv2/Relu:0"]  # the fused layer's output, by the graph's name


# -- attention --------------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["INT8", "FP8"])
@pytest.mark.parametrize("case", ["fused", "separate"])
def test_quantized_engines_run_attention_quantized_where_q_k_v_have_ranges(mode, case):
    assert precisions(build(quantized_attention_net(case), mode))["attention"] == mode


@pytest.mark.parametrize("mode", ["INT8", "FP8"])
def test_attention_with_an_input_without_a_range_runs_fp16_without_an_error(mode):
    net = quantized_attention_net("separate")
    net.inputs[2].dynamic_range = None
    assert precisions(build(net, mode))["attention"] == "FP16"


def projected_attention(v_range):
    """x -> Q, K and V projections (ranges 1, 2 and `v_range`), each split into 2 heads -> attention, heads merged:
    the projections fuse into one MatrixMultiply that the packed Attention reads in place."""
    net = Network("projected")
    x = net.add_input("x", "float32", (2, 5, 8))
    x.dynamic_range = 3.0
    heads = []
    for name, r in (("q", 1.0), ("k", 2.0), ("v", v_range)):
        p = add(net, "MatrixMultiply", [x, const(net, rand(8, 8), f"{name}/w")], name)
        p.dynamic_range = r
        heads.append(add(net, "Shuffle", [p], f"{name}/heads", reshape=[2, 5, 2, 4], second_perm=[0, 2, 1, 3]))
    scores = add(net, "MatrixMultiply", heads[:2], "scores", transpose_b=True)
    probs = add(net, "Softmax", [add(net, "Scale", [scores], "scaled", {"scale": np.array([0.5], "float32")})],
                "softmax", axis=-1)
    ctx = add(net, "MatrixMultiply", [probs, heads[2]], "context")
    net.mark_output(add(net, "Shuffle", [ctx], "merge", first_perm=[0, 2, 1, 3], reshape=[2, 5, 8]), "y")
    return net


def test_attention_reads_the_fused_qkv_projection_with_a_range_covering_q_k_v():
    layers = build(projected_attention(1.5), "INT8").network.layers
    attention = next(l for l in layers if l.kind == "Attention")
    assert attention.precision == "INT8" and attention.params["columns"] == [[0, 8], [8, 8], [16, 8]]
    assert len(precision.int8_inputs(attention)) == 1 and attention.inputs[0].dynamic_range == 2.0
    assert {l.precision for l in layers if l.kind == "MatrixMultiply"} == {"INT8"}


def test_a_projection_without_a_range_leaves_attention_fp16_and_the_projections_int8():
    """QAT graphs give ranges to the GEMMs' inputs only: the attention runs as before, no error."""
    layers = build(projected_attention(None), "INT8").network.layers
    assert {(l.kind, l.precision) for l in layers if l.kind in ("Attention", "MatrixMultiply")} == {
        ("Attention", "FP16"), ("MatrixMultiply", "INT8")}


def test_fp16_engines_run_attention_in_fp16_whatever_its_ranges():
    assert precisions(build(quantized_attention_net("fused"), "FP16"))["attention"] == "FP16"


def test_int8_without_any_range_runs_attention_fp16_too(caplog):
    net = projected_attention(None)
    for t in net.inputs + [t for layer in net.layers for t in layer.outputs]:
        t.dynamic_range = None
    layers = build(net, "INT8").network.layers
    assert {(l.kind, l.precision) for l in layers if l.kind in ("Attention", "MatrixMultiply")} == {
        ("Attention", "FP16"), ("MatrixMultiply", "FP16")}
    assert "no tensor has a dynamic range" in caplog.text


def test_the_int8_inputs_of_attention_are_its_distinct_q_k_v():
    separate, fused = (quantized_attention_net(case) for case in ("separate", "fused"))
    assert [t.name for t in precision.int8_inputs(separate.layers[0])] == ["q", "k", "v"]
    assert [t.name for t in precision.int8_inputs(fused.layers[0])] == ["qkv"]


# -- the numpy backend ------------------------------------------------------------------------------
def is_fp16(a):
    return np.array_equal(a, a.astype(np.float16).astype(a.dtype))


def test_fp16_engines_keep_binding_dtypes_and_hold_fp16_values():
    x = rand(4, 8, 8, 3)
    want = build(classifier(), "FP32").create_execution_context().execute_v2([x])
    engine = build(classifier(), "FP16")
    got = engine.create_execution_context().execute_v2([x])
    assert [t.dtype for t in engine.inputs + engine.outputs] == ["float32"] * 3
    assert all(g.dtype == np.float32 for g in got)
    assert is_fp16(got[1]) and not is_fp16(want[1])  # logits come from an FP16 layer
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-2, atol=1e-2)


def test_fp16_layers_round_inputs_and_weights_then_accumulate_in_fp32():
    net = Network("n")
    a = net.add_input("a", "float32", (3, 64))
    w = rand(64, 5)
    out = add(net, "MatrixMultiply", [a, const(net, w, "w")], "mm")
    net.mark_output(out, "y")
    engine = build(net, "FP16")
    x = rand(3, 64)
    got = engine.create_execution_context().execute_v2([x])[0]
    f16 = lambda v: v.astype(np.float16).astype(np.float64)
    want = (f16(x) @ f16(w)).astype(np.float16).astype(np.float32)  # exact sums, one rounding at the end
    np.testing.assert_array_equal(got, want)


def test_fp16_layers_store_their_weights_as_fp16_and_compute_the_same():
    engine = build(classifier(), "FP16")
    conv_layer = engine.network.layers[0]
    assert conv_layer.precision == "FP16" and {w.dtype for w in conv_layer.weights.values()} == {np.dtype("float16")}
    kept = build(classifier(), "FP32")
    assert {w.dtype for w in kept.network.layers[0].weights.values()} == {np.dtype("float32")}
    stored = read_header(engine.serialize())["layers"][0]["weights"]
    assert {ref["dtype"] for ref in stored.values()} == {"float16"}
    x = rand(4, 8, 8, 3)
    got = engine.create_execution_context().execute_v2([x])
    conv_layer.weights = dict(kept.network.layers[0].weights)  # float32 again: FP16 rounds them on read
    again = Runtime().deserialize_cuda_engine(engine.serialize()).create_execution_context().execute_v2([x])
    for g, a in zip(got, again):
        np.testing.assert_array_equal(g, a)


def test_fp16_overflow_gives_inf_as_on_the_gpu():
    net = Network("n")
    x = net.add_input("x", "float32", (2,))
    net.mark_output(add(net, "ElementWise", [x, const(net, [1.0], "c")], "add", op="sum"), "y")
    got = build(net, "FP16").create_execution_context().execute_v2([np.array([1e5, 2.0], "float32")])[0]
    assert np.isinf(got[0]) and got[1] == 3.0


@pytest.mark.parametrize("in_threads", [False, True])
def test_fp16_saturates_weights_and_constants_beyond_its_range(monkeypatch, in_threads):
    """An additive attention mask (1 - mask) * -1e9: in fp16 -1e9 saturates to -65504 (as TensorRT clamps
    weights), so unmasked positions get 0 x -65504 = 0, not 0 x -inf = NaN; in threads (large weights) alike."""
    if in_threads:
        monkeypatch.setattr(threads, "PARALLEL_BYTES", 0)
        monkeypatch.setattr(threads, "cpu_threads", lambda: 3)
    net = Network("n")
    keep = net.add_input("keep", "float32", (2, 4))
    scores = net.add_input("scores", "float32", (2, 4))
    masked = add(net, "ElementWise", [add(net, "ElementWise", [const(net, [1.0], "one"), keep], "sub", op="sub"),
                                      const(net, [-1e9], "big")], "mask", op="prod")
    net.mark_output(add(net, "ElementWise", [scores, masked], "add", op="sum"), "y")
    engine = build(net, "FP16")
    keep_v, scores_v = (np.array([[1, 1, 0, 1], [0, 1, 1, 1]], "float32"), rand(2, 4))
    got = engine.create_execution_context().execute_v2([keep_v, scores_v])[0]
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got[keep_v == 1], scores_v[keep_v == 1], atol=2e-3)
    assert (got[keep_v == 0] < -6e4).all()
    scale = Network("s")
    x = scale.add_input("x", "float32", (3,))
    scale.mark_output(add(scale, "Scale", [x], "scale", {"scale": np.array([1e6], "float32"),
                                                          "shift": np.array([np.inf], "float32")}), "y")
    (layer,) = build(scale, "FP16").network.layers
    assert layer.weights["scale"][0] == np.float16(65504) and np.isposinf(layer.weights["shift"][0])


def test_saturating_keeps_weights_inside_the_fp16_range_as_they_are_without_a_copy():
    inside = rand(64, 64)
    assert precision._saturate(inside) is inside
    mixed = np.array([1.0, -1e9, np.nan, np.inf, 7e4], "float32")
    np.testing.assert_array_equal(precision._saturate(mixed), [1.0, -65504, np.nan, np.inf, 65504])
    assert precision._saturate(np.zeros(0, "float32")).size == 0


def test_large_fp16_weights_are_rounded_in_threads_to_the_same_values(monkeypatch):
    one_thread = build(classifier(), "FP16")
    monkeypatch.setattr(threads, "PARALLEL_BYTES", 0)
    monkeypatch.setattr(threads, "cpu_threads", lambda: 3)
    threaded = build(classifier(), "FP16")
    for a, b in zip(one_thread.network.layers, threaded.network.layers):
        assert a.name == b.name and a.weights.keys() == b.weights.keys()
        for k in a.weights:
            assert a.weights[k].dtype == b.weights[k].dtype
            np.testing.assert_array_equal(a.weights[k], b.weights[k])


def test_int8_convolution_quantizes_as_tensorrt():
    net = Network("n")
    x = net.add_input("x", "float32", (1, 4, 4, 2))
    k = rand(3, 3, 2, 3)
    bias = rand(3)
    y = add(net, "Convolution", [x], "conv", {"kernel": k, "bias": bias}, strides=[1, 1], dilations=[1, 1],
            pre_padding=[1, 1], post_padding=[1, 1], groups=1)
    net.mark_output(y, "y")
    x.dynamic_range = 2.0
    engine = build(net, "INT8")
    assert precisions(engine)["conv"] == "INT8"
    v = rand(1, 4, 4, 2) * 2
    got = engine.create_execution_context().execute_v2([v])[0]

    # reference: symmetric int8, round half to even, clamp to 127, weights per output channel
    qx = np.clip(np.rint(v.astype(np.float64) / (2.0 / 127)), -127, 127)
    sk = np.abs(k).max(axis=(0, 1, 2)) / 127
    qk = np.clip(np.rint(k / sk), -127, 127)
    padded = np.pad(qx, [(0, 0), (1, 1), (1, 1), (0, 0)])
    acc = np.zeros((1, 4, 4, 3))
    for i in range(4):
        for j in range(4):
            acc[0, i, j] = np.tensordot(padded[0, i:i + 3, j:j + 3], qk, axes=3)
    assert np.all(acc == np.round(acc))  # integer sums
    want = (acc * (2.0 / 127) * sk).astype(np.float32) + bias
    np.testing.assert_array_equal(got, want.astype(np.float16).astype(np.float32))


def _conv_with_residual(residual_range, mode="INT8", k=None):
    net = Network("n")
    x, r = net.add_input("x", "float32", (1, 4, 4, 3)), net.add_input("r", "float32", (1, 4, 4, 3))
    x.dynamic_range, r.dynamic_range = 2.0, residual_range
    k = rand(1, 1, 3, 3) if k is None else k
    y = add(net, "Convolution", [x, r], "conv", {"kernel": k}, strides=[1, 1], dilations=[1, 1],
            pre_padding=[0, 0], post_padding=[0, 0], groups=1, activation={"type": "relu"})
    net.mark_output(y, "y")
    return build(net, mode), k


def test_int8_convolution_reads_a_residual_with_a_range_quantized():
    """TensorRT's int8 residual: rounded to its tensor's int8 grid (half to even, clamped), added in fp32."""
    v, res = rand(1, 4, 4, 3), rand(1, 4, 4, 3) * 2
    res.flat[0], res.flat[1] = 0.375, 40.0  # a tie (1.5 steps of 0.25: rounds to 2), a value past the range
    engine, k = _conv_with_residual(127 * 0.25)
    got = engine.create_execution_context().execute_v2([v, res])[0]
    sx, sk = 2.0 / 127, np.abs(k).max(axis=(0, 1, 2)) / 127
    acc = np.clip(np.rint(v / sx), -127, 127) @ np.clip(np.rint(k[0, 0] / sk), -127, 127)
    rq = np.clip(np.rint(res.astype(np.float64) / 0.25), -127, 127)
    assert rq.flat[0] == 2 and rq.flat[1] == 127
    want = (acc * sx * sk).astype(np.float32) + rq.astype(np.float32) * np.float32(0.25)
    np.testing.assert_array_equal(got, np.maximum(want, 0).astype(np.float16).astype(np.float32))


def test_int8_convolution_reads_a_residual_without_a_range_as_it_is():
    v, res = rand(1, 4, 4, 3), rand(1, 4, 4, 3) * 2
    engine, k = _conv_with_residual(None)
    got = engine.create_execution_context().execute_v2([v, res])[0]
    sx, sk = 2.0 / 127, np.abs(k).max(axis=(0, 1, 2)) / 127
    acc = np.clip(np.rint(v / sx), -127, 127) @ np.clip(np.rint(k[0, 0] / sk), -127, 127)
    want = (acc * sx * sk).astype(np.float32) + res
    np.testing.assert_allclose(got, np.maximum(want, 0).astype(np.float16).astype(np.float32), rtol=1e-6)


def test_fp8_convolution_reads_a_residual_with_a_range_rounded_to_its_e4m3_grid():
    """FP8 likewise: the residual read is its E4M3 value at its scale (range / 448; nearest, ties to even,
    saturated at 448), so the output equals that of the rounded residual read without a range."""
    v, res = rand(1, 4, 4, 3), rand(1, 4, 4, 3) * 2
    res.flat[0], res.flat[1] = 1.0625 * 0.25, 200.0  # a tie between 1 and 1.125 steps (to 1), a value past 448 steps
    rounded = quantization.round_e4m3(res.astype(np.float64) / 0.25)
    assert rounded.flat[0] == 1.0 and rounded.flat[1] == 448.0
    engine, k = _conv_with_residual(448 * 0.25, "FP8")
    plain, _ = _conv_with_residual(None, "FP8", k)
    got = engine.create_execution_context().execute_v2([v, res])[0]
    want = plain.create_execution_context().execute_v2([v, (rounded * 0.25).astype(np.float32)])[0]
    np.testing.assert_array_equal(got, want)
    assert not np.array_equal(got, plain.create_execution_context().execute_v2([v, res])[0])


def _pool_then_conv():
    net = Network("n")
    x = net.add_input("x", "float32", (1, 4, 4, 16))
    pooled = add(net, "Pooling", [x], "pool", type="max", window=[2, 2], strides=[2, 2], pre_padding=[0, 0],
                 post_padding=[0, 0])
    y = add(net, "Convolution", [pooled], "conv", {"kernel": rand(1, 1, 16, 4)}, strides=[1, 1], dilations=[1, 1],
            pre_padding=[0, 0], post_padding=[0, 0], groups=1)
    net.mark_output(y, "y")
    x.dynamic_range, pooled.dynamic_range = 2.0, 1.5
    return net


@pytest.mark.parametrize("mode", ["INT8", "FP8"])
def test_quantized_max_pool_output_takes_its_input_range(mode):
    """So quantizing the pooled tensor gives the max of the quantized input (rounding keeps order): a max pool of
    int8 or E4M3 values is exact."""
    layers = {layer.name: layer for layer in build(_pool_then_conv(), mode).network.layers}
    assert layers["pool"].outputs[0].dynamic_range == 2.0 and layers["conv"].precision == mode
    assert build(_pool_then_conv(), "FP16").network.layers[0].outputs[0].dynamic_range == 1.5


def test_quantize_rounds_half_to_even_and_clamps():
    q, scale = quantization.quantize(np.array([0.5, 1.5, 2.5, -2.5, 400.0, -400.0]), 127.0)
    assert scale == 1.0 and q.tolist() == [0, 2, 2, -2, 127, -127]
    w = np.array([[1.0, -0.5], [-2.0, 0.25]])
    qw, sw = quantization.quantize_per_channel(w, axis=-1)
    assert sw.ravel().tolist() == [2.0 / 127, 0.5 / 127] and qw.tolist() == [[64, -127], [-127, 64]]


def test_int8_matmul_with_two_activations_uses_both_ranges():
    net = Network("n")
    a, b = net.add_input("a", "float32", (2, 3, 8)), net.add_input("b", "float32", (2, 8, 4))
    net.mark_output(add(net, "MatrixMultiply", [a, b], "bmm"), "y")
    rng = np.random.default_rng(5)  # its own draw: the shared generator's state depends on the tests run before
    va, vb = (rng.standard_normal(s).astype("float32") for s in ((2, 3, 8), (2, 8, 4)))
    a.dynamic_range, b.dynamic_range = np.abs(va).max(), np.abs(vb).max()
    engine = build(net, "INT8")
    got = engine.create_execution_context().execute_v2([va, vb])[0]
    assert precisions(engine)["bmm"] == "INT8"
    np.testing.assert_allclose(got, va @ vb, atol=0.1)


def test_int8_plans_keep_precisions_and_ranges():
    x = rand(4, 8, 8, 3)
    engine = build(classifier(with_ranges=True), "INT8")
    loaded = Runtime().deserialize_cuda_engine(engine.serialize())
    assert precisions(loaded) == precisions(engine)
    assert loaded.network.inputs[0].dynamic_range == 3.0
    for got, want in zip(loaded.create_execution_context().execute_v2([x]),
                         engine.create_execution_context().execute_v2([x])):
        np.testing.assert_array_equal(got, want)
