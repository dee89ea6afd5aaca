"""INT8 convolutions on ONNX Runtime's fast uint8 x int8 kernels (QLinearConv; MatMulIntegerToFloat for 1x1
convolutions with float outputs) where they are exact, fp32 on dequantized values elsewhere; which tensors are
non-negative; unread nodes pruned from lowered models."""
import numpy as np
import onnx

from ort_helpers import ORT, TOL, with_precision
from tftrt_py.engine import Engine, Network
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
    return Engine(with_precision(build(), "INT8"), "INT8", backend=backend).create_execution_context()


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


def test_nonnegative_follows_activations_and_pooling():
    net = Network("signs")
    x = net.add_input("x", "float32", (1, 4, 4, 2))
    relu = net.add_layer("Activation", [x], {"type": "relu"}).outputs[0]
    pooled = net.add_layer("Pooling", [relu], {"type": "max", "window": [2, 2], "strides": [2, 2], "pre_padding": [0, 0],
                                           "post_padding": [0, 0]}).outputs[0]
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
