"""INT8 convolutions on ONNX Runtime's fast uint8 x int8 kernels (QLinearConv; MatMulIntegerToFloat for 1x1
convolutions with float outputs) where they are exact, fp32 on dequantized values elsewhere; INT8 matrix
multiplies on uint8 x int8 sums where the CPU sums them exactly, uint8 x uint8 elsewhere; INT8 attention on
fake-quantized q, k and v; which tensors are non-negative; unread nodes pruned from lowered models."""
import numpy as np
import onnx
import pytest

from networks import quantized_attention_inputs, quantized_attention_net
from ort_helpers import ORT, STRICT, TOL, compare, with_precision
from tftrt_py.engine import Engine, Network
from tftrt_py.engine.backends.onnxruntime import backend as ort_backend
from tftrt_py.engine.backends.onnxruntime import int8
from tftrt_py.engine.backends.onnxruntime.graph import prune
from tftrt_py.engine.backends.onnxruntime.int8 import nonnegative
from tftrt_py.engine.backends.onnxruntime.lowering import lower

pytestmark = ORT

SHAPE = (2, 8, 8, 16)
RELU = {"type": "relu"}


def _conv(net, x, rng, act=RELU, residual=None, amax=2.0, size=3, stride=1):
    pad = [size // 2] * 2
    params = dict(strides=[stride] * 2, dilations=[1, 1], pre_padding=pad, post_padding=pad, groups=1,
                  activation=act)
    weights = {"kernel": (rng.standard_normal((size, size, 16, 16)) / (4 * size)).astype(np.float32),
               "bias": rng.standard_normal(16).astype(np.float32) * 0.1}
    out = net.add_layer("Convolution", [x] + ([residual] if residual is not None else []), params, weights).outputs[0]
    out.dynamic_range = amax
    return out


def _chain() -> Network:
    """x -> c1 (relu) -> c2 (relu) -> c3 (relu) -> c4 (+ c1, relu): c2 and c3 only feed INT8 convolutions."""
    rng = np.random.default_rng(7)
    net = Network("chain")
    x = net.add_input("x", "float32", SHAPE)
    x.dynamic_range = 3.0
    c1 = _conv(net, x, rng)
    c3 = _conv(net, _conv(net, c1, rng), rng, amax=1.5)  # ranges below the values: clipped as numpy clips
    net.mark_output(_conv(net, c3, rng, residual=c1), name="y")
    return net


def _inputs(rng):
    return {"x": rng.uniform(-3.0, 3.0, SHAPE).astype(np.float32)}


def _int8(build, backend):
    return Engine(with_precision(build(), "INT8"), "INT8", backend=backend, build_config=STRICT
                  ).create_execution_context()


def assert_within_a_step(build, seed: int) -> Engine:
    """onnxruntime INT8 against numpy INT8 on `build`'s network: within INT8 tolerance but where numpy's fp16
    rounding of an intermediate output moved a value across a quantization step (the CPU keeps fp32: 1-12% of
    these outputs, as many as with exact ConvInteger sums; the most where a quantized residual adds its own
    steps), and there within a step's effect."""
    inputs = _inputs(np.random.default_rng(seed))
    want = _int8(build, "numpy").execute(inputs)
    ctx = _int8(build, "onnxruntime")
    got = ctx.execute(inputs)
    for name, ref in want.items():
        scale = max(1.0, float(np.max(np.abs(ref))))
        diff = np.abs(got[name] - ref)
        assert got[name].shape == ref.shape and np.all(np.isfinite(got[name]))
        assert np.mean(diff > TOL["INT8"] * (np.abs(ref) + scale)) < 0.15, name
        assert np.max(diff) < 1e-2 * scale, name
    return ctx.engine


def test_relu_chain_runs_on_quantized_kernels_and_matches_numpy():
    engine = assert_within_a_step(_chain, 0)
    ops = [n.op_type for n in prune(lower(engine.network)).graph.node]
    # c2 and c3 quantized (their inputs cannot be negative, only INT8 convolutions read their outputs); c1 (signed
    # input) and c4 (residual) in fp32 on dequantized values; the float forms of c2 and c3 pruned
    assert ops.count("QLinearConv") == 2 and ops.count("Conv") == 2
    assert "ConvInteger" not in ops


def _bottleneck() -> Network:
    """x -> c1 (3x3 relu) -> p1 (1x1 relu) -> c2 (3x3 relu) -> p2 (1x1, + c1, relu) -> p3 (1x1 stride 2): a
    ResNet block's 1x1 convolutions, with a residual and a strided projection."""
    rng = np.random.default_rng(9)
    net = Network("bottleneck")
    x = net.add_input("x", "float32", SHAPE)
    x.dynamic_range = 3.0
    c1 = _conv(net, x, rng)
    c2 = _conv(net, _conv(net, c1, rng, size=1), rng)
    p2 = _conv(net, c2, rng, residual=c1, size=1)
    net.mark_output(_conv(net, p2, rng, act=None, size=1, stride=2, amax=4.0), name="y")
    return net


def test_pointwise_convolutions_with_float_outputs_run_as_integer_matmuls():
    engine = assert_within_a_step(_bottleneck, 2)
    ops = [n.op_type for n in prune(lower(engine.network)).graph.node]
    # p1 quantized by QLinearConv (only c2 reads it), c2 too (p2 reads it); p2 (residual) and p3 (strided, float
    # output) as u8 x s8 matrix multiplies over channels-last pixels; c1 (signed input) in fp32
    assert ops.count("QLinearConv") == 2 and ops.count("MatMulIntegerToFloat") == 2 and ops.count("Conv") == 1


def test_float_consumer_keeps_the_float_output():
    def build():
        rng = np.random.default_rng(8)
        net = Network("float_consumer")
        x = net.add_input("x", "float32", SHAPE)
        x.dynamic_range = 3.0
        c1 = _conv(net, x, rng)
        c2 = _conv(net, c1, rng)
        net.mark_output(_conv(net, c2, rng), name="y")
        net.mark_output(c2, name="c2")  # read as float: not clipped to its range
        return net

    engine = assert_within_a_step(build, 1)
    assert [n.op_type for n in prune(lower(engine.network)).graph.node].count("QLinearConv") == 1  # c3's input


@pytest.fixture(params=[False, True], ids=["u8_x_u8", "u8_x_s8"])
def signed(request, monkeypatch):
    """Either kernel of INT8 matrix multiplies (uint8 x int8 only where this CPU sums it exactly)."""
    if request.param and not int8.signed_sums_exact():
        pytest.skip("this CPU's ONNX Runtime adds uint8 x int8 product pairs in int16 with saturation (no VNNI, AMX)")
    monkeypatch.setattr(int8, "signed_sums_exact", lambda: request.param)
    return request.param


def _matmul_network(a_shape, b_shape, constant: str = "", params=None) -> Network:
    """A MatrixMultiply of inputs (ranges 2) or, where `constant` names "a" or "b", that operand a constant; a bias
    where B is the constant (a Dense layer)."""
    rng = np.random.default_rng(5)
    net = Network("matmul")
    operands = []
    for name, shape in (("a", a_shape), ("b", b_shape)):
        if name == constant:
            operands.append(net.add_constant((rng.standard_normal(shape) / 4).astype(np.float32)))
        else:
            operands.append(net.add_input(name, "float32", shape))
            operands[-1].dynamic_range = 2.0
    width = b_shape[-2 if (params or {}).get("transpose_b") else -1]
    weights = {"bias": rng.standard_normal(width).astype(np.float32)} if constant == "b" else {}
    y = net.add_layer("MatrixMultiply", operands, params, weights).outputs[0]
    net.mark_output(y, name="y")
    return net


MATMULS = {  # (A's shape, B's shape, the constant operand, params)
    "dense_gelu": ((4, 16, 64), (64, 48), "b", {"activation": {"type": "gelu_tanh"}}),  # FastGelu adds the bias
    "dense": ((16, 64), (48, 64), "b", {"transpose_b": True}),  # the integer kernel adds it
    "activations": ((3, 16, 32), (3, 32, 8), "", {}),
    "constant_a": ((24, 32), (32, 8), "a", {}),
}


@pytest.mark.parametrize("case", sorted(MATMULS))
def test_int8_matrix_multiplies_match_numpy_on_either_kernel(signed, case):
    a_shape, b_shape, constant, params = MATMULS[case]
    inputs = {name: shape for name, shape in (("a", a_shape), ("b", b_shape)) if name != constant}
    engine = compare(lambda: _matmul_network(a_shape, b_shape, constant, params),
                     lambda rng: {n: rng.uniform(-2.0, 2.0, s).astype(np.float32) for n, s in inputs.items()}, "INT8")
    model = prune(lower(engine.network))
    ops = [n.op_type for n in model.graph.node]
    # scales per column (or per tensor) and a bias no fused activation takes go into the integer kernel; a constant
    # A's per row scales stay a Mul
    assert ops.count("MatMulIntegerToFloat" if constant != "a" else "MatMulInteger") == 1
    assert "Add" not in ops
    integer = next(n for n in model.graph.node if n.op_type.startswith("MatMulInteger"))
    weights = {w.name: w.data_type for w in model.graph.initializer}
    b_is_int8 = (weights[integer.input[1]] == onnx.TensorProto.INT8 if integer.input[1] in weights
                 else _quantized_to(model, integer.input[1]) == onnx.TensorProto.INT8)
    assert b_is_int8 == signed


def _quantized_to(model, value: str) -> int:
    """The element type a QuantizeLinear making `value` quantizes to (that of its zero point)."""
    node = next(n for n in model.graph.node if value in n.output)
    return next(w.data_type for w in model.graph.initializer if w.name == node.input[2])


def test_the_signed_kernel_is_taken_only_where_it_sums_exactly():
    """Where the probe says so, uint8 x int8 sums of operands that saturate int16 pairs are exact at any size."""
    if not int8.signed_sums_exact():
        pytest.skip("this CPU's uint8 x int8 sums saturate: matrix multiplies take uint8 x uint8")
    rng = np.random.default_rng(2)
    w = np.where(rng.random((256, 40)) < 0.5, 1.0, -1.0).astype(np.float32)  # quantized to +-127 per column
    net = Network("saturating")
    x = net.add_input("x", "float32", (33, 256))
    x.dynamic_range = 1.0
    net.mark_output(net.add_layer("MatrixMultiply", [x, net.add_constant(w)]).outputs[0], name="y")
    ctx = Engine(with_precision(net, "INT8"), "INT8", backend="onnxruntime", build_config=STRICT
                 ).create_execution_context()
    got = ctx.execute({"x": np.ones((33, 256), np.float32)})["y"]  # every activation 127 (uint8 255)
    np.testing.assert_allclose(got, np.ones((33, 256)) @ w, rtol=1e-6)


def _timed(monkeypatch, int8_ms, fp16_ms):
    """Lowerings time as given (the INT8 one is timed first); returns the list of timings asked for. Sessions get
    one thread, so the choice of thread count (test_ort_engine.py) times nothing here."""
    asked = []
    monkeypatch.setattr(ort_backend.OnnxRuntimeBackend, "threads", lambda self: 1)

    def run_ms(program, feed):
        asked.append(program)
        return int8_ms if len(asked) == 1 else fp16_ms

    monkeypatch.setattr(ort_backend, "_run_ms", run_ms)
    return asked


@pytest.mark.parametrize("int8_ms, fp16_ms, kept", [(2.0, 1.0, "FP16"), (1.0, 2.0, "INT8")])
def test_int8_layers_run_in_fp16_where_that_is_faster(monkeypatch, int8_ms, fp16_ms, kept):
    asked = _timed(monkeypatch, int8_ms, fp16_ms)
    ctx = Engine(with_precision(_chain(), "INT8"), "INT8", backend="onnxruntime").create_execution_context()
    assert len(asked) == 2
    assert {layer.precision for layer in ctx.engine.network.layers if layer.kind == "Convolution"} == {kept}
    # what runs is what the network says: the numpy backend on the engine's own network agrees
    inputs = _inputs(np.random.default_rng(4))
    want = Engine(ctx.engine.network, "INT8", backend="numpy").create_execution_context().execute(inputs)["y"]
    got = ctx.execute(inputs)["y"]
    scale = float(np.max(np.abs(want)))
    assert np.max(np.abs(got - want)) < (2e-3 if kept == "FP16" else 1e-2) * scale


def test_a_lowering_that_fails_on_zeros_keeps_int8(monkeypatch):
    def run_ms(program, feed):
        raise ValueError("zeros do not suit this network")

    monkeypatch.setattr(ort_backend, "_run_ms", run_ms)
    ctx = Engine(with_precision(_chain(), "INT8"), "INT8", backend="onnxruntime").create_execution_context()
    assert all(layer.precision == "INT8" for layer in ctx.engine.network.layers if layer.kind == "Convolution")
    assert "QLinearConv" in [n.op_type for n in prune(lower(ctx.engine.network)).graph.node]


def test_strict_types_keep_int8_untimed(monkeypatch):
    asked = _timed(monkeypatch, 2.0, 1.0)
    ctx = Engine(with_precision(_chain(), "INT8"), "INT8", backend="onnxruntime", build_config=STRICT
                 ).create_execution_context()
    assert not asked and all(layer.precision == "INT8" for layer in ctx.engine.network.layers
                             if layer.kind == "Convolution")


def test_nonnegative_follows_activations_and_pooling():
    net = Network("signs")
    x = net.add_input("x", "float32", (1, 4, 4, 2))
    relu = net.add_layer("Activation", [x], {"type": "relu"}).outputs[0]
    pooled = net.add_layer("Pooling", [relu], {"type": "max", "window": [2, 2], "strides": [2, 2],
                                               "pre_padding": [0, 0], "post_padding": [0, 0]}).outputs[0]
    tanh = net.add_layer("Activation", [x], {"type": "tanh"}).outputs[0]
    assert nonnegative(relu) and nonnegative(pooled)
    assert not nonnegative(x) and not nonnegative(tanh)


def test_prune_drops_nodes_no_output_reads():
    net = Network("dead")
    x = net.add_input("x", "float32", (2, 3))
    net.add_layer("Unary", [x], {"op": "exp"})
    net.mark_output(net.add_layer("Unary", [x], {"op": "abs"}).outputs[0], name="y")
    model = lower(net)
    assert "Exp" in [n.op_type for n in model.graph.node]
    pruned = prune(model)
    onnx.checker.check_model(pruned)
    assert [n.op_type for n in pruned.graph.node] == ["Abs", "Identity"]


@pytest.mark.parametrize("case, distinct, fused", [("fused", 1, True), ("masked", 1, True), ("causal", 1, False),
                                                   ("separate", 3, False)])
def test_int8_attention_fake_quantizes_q_k_v_as_numpy_does(case, distinct, fused):
    """Within fp16 rounding of numpy's output (the CPU keeps fp32): the same quantized q, k and v (but for the rare
    value within fp32 rounding of a half step), each distinct tensor quantized once, then the float lowering (ONNX
    Runtime's MultiHeadAttention for packed heads without a causal triangle)."""
    engine = compare(lambda: quantized_attention_net(case), lambda rng: quantized_attention_inputs(case, rng), "INT8")
    ops = [n.op_type for n in prune(lower(engine.network)).graph.node]
    assert ops.count("QuantizeLinear") == ops.count("Clip") == distinct
    assert ("MultiHeadAttention" in ops) == fused


@pytest.mark.parametrize("strict", [False, True])
def test_int8_attention_runs_fp16_unless_types_are_strict(monkeypatch, strict):
    """ONNX Runtime has no int8 attention (its INT8 lowering only emulates the rounding), so a non-strict engine runs
    the layer in FP16 without timing it; strict types keep it INT8, fake-quantized."""
    asked = _timed(monkeypatch, 1.0, 2.0)
    ctx = Engine(with_precision(quantized_attention_net("fused"), "INT8"), "INT8", backend="onnxruntime",
                 build_config={"strict_types": strict}).create_execution_context()
    attention = [layer for layer in ctx.engine.network.layers if layer.kind == "Attention"]
    assert [layer.precision for layer in attention] == ["INT8" if strict else "FP16"] and not asked
    ops = [n.op_type for n in prune(lower(ctx.engine.network)).graph.node]
    assert ("QuantizeLinear" in ops) == strict
