"""precision FP8 (our extension) in the engine: E4M3FN rounding (every code, ties to even, saturation, NaN),
the builder's choice of FP8 layers and their ranges, the numpy backend computing FP8 layers as the GPU does
(against an emulation built on ml_dtypes and against FP32), plans, ONNX Runtime running FP8 as FP32 (said
once), and the cupy backend's compute-capability rule."""
import logging

import ml_dtypes
import numpy as np
import pytest

from tftrt_py.engine import Builder, BuilderConfig, Network, PlanError, Runtime
from tftrt_py.engine.backends.cupy.ops import fp8 as cupy_fp8
from tftrt_py.engine.reference import apply_activation, conv_sums
from tftrt_py.engine.quantization import E4M3_MAX, round_e4m3
from tftrt_py.engine.errors import BuildError, MissingDynamicRangeError

RNG = np.random.default_rng(88)


def e4m3_code_value(code: int) -> float:
    """The value of one E4M3FN byte, from its bits: sign, 4 exponent bits (bias 7), 3 mantissa bits;
    S.1111.111 is NaN, there is no infinity."""
    sign = -1.0 if code & 0x80 else 1.0
    exponent, mantissa = (code >> 3) & 0xF, code & 0x7
    if exponent == 0xF and mantissa == 0x7:
        return float("nan")
    if exponent == 0:
        return sign * mantissa * 2.0 ** -9
    return sign * (1 + mantissa / 8) * 2.0 ** (exponent - 7)


CODES = np.array([e4m3_code_value(c) for c in range(256)])


def rel_l2(got, want):
    return float(np.linalg.norm(np.asarray(got, np.float64) - want) / np.linalg.norm(want))


# -- rounding --------------------------------------------------------------------------------------------------
def test_the_code_table_is_ml_dtypes_float8_e4m3fn():
    from_ml_dtypes = np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float64)
    np.testing.assert_array_equal(CODES, from_ml_dtypes)
    assert np.nanmax(CODES) == E4M3_MAX == 448 and np.isnan(CODES).sum() == 2


def test_every_code_rounds_to_itself_and_nan_stays_nan():
    got = round_e4m3(CODES)
    np.testing.assert_array_equal(got, CODES)
    assert np.array_equal(np.signbit(got), np.signbit(CODES))  # -0 (code 0x80) keeps its sign


def test_values_between_codes_round_to_the_nearest_as_ml_dtypes_does():
    magnitudes = RNG.uniform(0, 464, 200_000) * RNG.choice([1, 1e-1, 1e-2, 1e-3], 200_000)
    x = (magnitudes * RNG.choice([-1, 1], magnitudes.size)).astype(np.float32)
    want = x.astype(ml_dtypes.float8_e4m3fn).astype(np.float64)
    np.testing.assert_array_equal(round_e4m3(x), want)


@pytest.mark.parametrize("x, want", [
    (1 + 1 / 16, 1.0),          # halfway between 1 and 1.125: the even mantissa (0)
    (1 + 3 / 16, 1.25),         # halfway between 1.125 and 1.25: the even mantissa (2)
    (2.0 ** -10, 0.0),          # halfway between 0 and the smallest subnormal 2**-9
    (3 * 2.0 ** -10, 2.0 ** -8),  # halfway between subnormals 1 and 2 (x 2**-9): 2
    (-(416 + 16), -448.0),      # halfway between 416 and 448: 448's mantissa (6) is even
    (240 + 8, 256.0),           # halfway between 240 (last of its binade) and 256: the next binade
])
def test_ties_round_to_even(x, want):
    assert round_e4m3(np.array([x]))[0] == want


def test_saturation_to_448_for_large_values_and_infinities():
    x = np.array([448, 463.9, 464, 1e4, 3e38, np.inf, -500, -np.inf, np.nan])
    got = round_e4m3(x)
    np.testing.assert_array_equal(got[:-1], [448, 448, 448, 448, 448, 448, -448, -448])
    assert np.isnan(got[-1])


# -- builder ---------------------------------------------------------------------------------------------------
def conv_mlp_net(ranges=True):
    """input [4, 8, 8, 16] -> conv 3x3 (bias, relu) -> mean over H, W -> matmul by a constant [8, 6] + 1."""
    rng = np.random.default_rng(0)  # the same weights in every build
    net = Network("conv_mlp")
    x = net.add_input("x", "float32", (4, 8, 8, 16))
    conv = net.add_layer("Convolution", [x], dict(strides=[1, 1], dilations=[1, 1], pre_padding=[1, 1],
                                                  post_padding=[1, 1], groups=1, activation={"type": "relu"}),
                         {"kernel": (rng.standard_normal((3, 3, 16, 8)) * 0.2).astype("float32"),
                          "bias": rng.standard_normal(8).astype("float32")}, name="conv")
    mean = net.add_layer("Reduce", conv.outputs, dict(op="mean", axes=[1, 2], keep_dims=False), name="mean")
    w = net.add_constant(rng.standard_normal((8, 6)).astype("float32"), name="w")
    mm = net.add_layer("MatrixMultiply", [mean.outputs[0], w], {}, name="mm")
    one = net.add_constant(np.ones((1, 6), "float32"), name="one")
    add = net.add_layer("ElementWise", [mm.outputs[0], one], dict(op="sum"), name="add")
    net.mark_output(add.outputs[0], name="y")
    if ranges:
        x.dynamic_range, mean.outputs[0].dynamic_range = 4.0, 3.0
    return net


def build(precision="FP8", backend="numpy", **kw):
    return Builder(BuilderConfig(precision=precision, backend=backend)).build_engine(conv_mlp_net(**kw))


def run(engine, x):
    return engine.create_execution_context().execute({"x": x})["y"]


def test_fp8_runs_convolutions_and_matrix_multiplies_in_fp8_and_the_rest_in_fp16():
    engine = build()
    kinds = {layer.kind: layer.precision for layer in engine.network.layers if layer.precision}
    assert kinds["Convolution"] == "FP8" and kinds["MatrixMultiply"] == "FP8"
    assert {p for k, p in kinds.items() if k not in ("Convolution", "MatrixMultiply")} <= {"FP16", "FP32"}
    assert engine.precision == "FP8"


def test_fp8_without_any_range_builds_fp16_with_a_warning(caplog):
    with caplog.at_level(logging.WARNING):
        engine = build(ranges=False)
    assert "FP8 engine 'conv_mlp': no tensor has a dynamic range" in caplog.text
    assert "FP8" not in {layer.precision for layer in engine.network.layers}


def test_fp8_layers_need_a_range_for_every_activation_operand():
    net = conv_mlp_net(ranges=False)
    net.inputs[0].dynamic_range = 4.0  # the matmul's input has none
    with pytest.raises(MissingDynamicRangeError, match="FP8 engine 'conv_mlp': no quantization range") as info:
        Builder(BuilderConfig(precision="FP8")).build_engine(net)
    assert len(info.value.tensors) == 1


def test_unknown_precision_is_refused():
    with pytest.raises(BuildError, match="use one of FP32, FP16, INT8, FP8"):
        BuilderConfig(precision="FP4")


# -- the numpy backend ---------------------------------------------------------------------------------------
def e4m3(x):
    """Independent of round_e4m3: ml_dtypes' rounding, on values already inside +-448."""
    return np.asarray(x, np.float32).astype(ml_dtypes.float8_e4m3fn).astype(np.float64)


def emulate(engine, x):
    """The FP8 contract for conv_mlp_net's engine, through ml_dtypes: E4M3 operands (per-tensor activation
    scales range / 448, per-channel weight scales max|w| / 448), sums of the exact products, fp32 epilogue, fp16
    outputs; the layers between in fp16."""
    layers = {layer.kind: layer for layer in engine.network.layers}
    conv, mm = layers["Convolution"], layers["MatrixMultiply"]
    sx = conv.inputs[0].dynamic_range / 448
    k = conv.weights["kernel"].astype(np.float64)
    sk = np.abs(k).max(axis=(0, 1, 2)) / 448
    sums = conv_sums(e4m3(np.clip(x / sx, -448, 448)), e4m3(k / sk), conv.params)
    y = apply_activation((sums * sx * sk + conv.weights["bias"]).astype(np.float32), {"type": "relu"})
    y = y.astype(np.float16).astype(np.float32)
    mean = y.mean(axis=(1, 2)).astype(np.float16).astype(np.float64)  # an FP16 layer
    sa = mm.inputs[0].dynamic_range / 448
    w = mm.inputs[1].producer.weights["value"].astype(np.float64)
    sw = np.abs(w).max(axis=0) / 448
    z = (e4m3(np.clip(mean / sa, -448, 448)) @ e4m3(w / sw)) * sa * sw
    return (z.astype(np.float16).astype(np.float32) + 1).astype(np.float16).astype(np.float32)


def test_numpy_fp8_engine_computes_the_contract_and_stays_near_fp32():
    fp8, fp32 = build(), build("FP32")
    for _ in range(2):
        x = RNG.uniform(-4, 4, (4, 8, 8, 16)).astype("float32")
        got, want = run(fp8, x), run(fp32, x)
        np.testing.assert_allclose(got, emulate(fp8, x), rtol=2e-3, atol=2e-3)
        # E4M3's 3 mantissa bits: a few percent on a matmul over 8 terms (convolutions over 144 average it out)
        assert 1e-3 < rel_l2(got, want) < 8e-2


def test_activations_beyond_the_range_saturate():
    engine = build()
    x = RNG.uniform(-4, 4, (4, 8, 8, 16)).astype("float32")
    x[0, 0, 0, 0] = 1e6  # beyond the input's range of 4: clipped to 4 as the GPU saturates
    clipped = x.copy()
    clipped[0, 0, 0, 0] = 4.0
    np.testing.assert_array_equal(run(engine, x), run(engine, clipped))


def test_fp8_plans_round_trip_and_unknown_precisions_are_refused():
    engine = build()
    loaded = Runtime().deserialize_cuda_engine(engine.serialize())
    assert loaded.precision == "FP8"
    assert [layer.precision for layer in loaded.network.layers] == [layer.precision for layer in engine.network.layers]
    x = RNG.uniform(-4, 4, (4, 8, 8, 16)).astype("float32")
    np.testing.assert_array_equal(run(loaded, x), run(engine, x))
    from tftrt_py.engine import plan as plan_lib

    with pytest.raises(PlanError, match=r"plan header field precision is \"FP9\", expected one of FP32, FP16, "
                                        r"INT8, FP8"):
        plan_lib._check_header({"name": "n", "precision": "FP9"}, 0)
    with pytest.raises(PlanError, match=r"layers\[0\]\.precision is \"FP9\""):
        plan_lib._check_header({"name": "n", "precision": "FP8", "inputs": [], "outputs": [],
                                "layers": [{"name": "l", "kind": "Identity", "precision": "FP9"}]}, 0)


# -- ONNX Runtime: FP8 runs FP32 ------------------------------------------------------------------------------
def test_onnxruntime_runs_fp8_layers_in_fp32_and_says_so_once(caplog, monkeypatch):
    from tftrt_py.engine.backends.onnxruntime import lowering

    monkeypatch.setattr(lowering, "_said", set())
    with caplog.at_level(logging.WARNING, logger=lowering.__name__):
        engine = build(backend="onnxruntime")
        build(backend="onnxruntime")
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("FP8 requested")]
    assert said == ["FP8 requested: the CPU runs FP32 (no FP8 kernels on ONNX Runtime's CPU; the numpy backend "
                    "computes FP8 as the GPU does)"]
    assert {layer.precision for layer in engine.network.layers if layer.kind == "Convolution"} == {"FP8"}
    fp32 = build("FP32")
    x = RNG.uniform(-4, 4, (4, 8, 8, 16)).astype("float32")
    np.testing.assert_allclose(run(engine, x), run(fp32, x), rtol=1e-5, atol=1e-5)


# -- the cupy backend's rule (decided without a GPU) ----------------------------------------------------------
@pytest.mark.parametrize("capability", ["52", "75", "80", "86", "87"])
def test_cupy_refuses_fp8_below_compute_capability_8_9(capability):
    with pytest.raises(BuildError, match=r"engine 'e': precision FP8 needs a GPU of compute capability 8\.9 or "
                                         r"later .*Build with precision_mode='INT8' \(same calibration\) or 'FP16'"):
        cupy_fp8.check_device("e", "FP8", capability, f"GPU (sm_{capability})")


@pytest.mark.parametrize("capability", ["89", "90", "100", "120"])
def test_cupy_builds_fp8_from_compute_capability_8_9(capability):
    assert cupy_fp8.check_device("e", "FP8", capability, "GPU") is None


@pytest.mark.parametrize("precision", ["FP32", "FP16", "INT8"])
def test_other_precisions_build_on_older_gpus(precision):
    assert cupy_fp8.check_device("e", precision, "75", "GPU") is None


def test_cupy_stores_e4m3_values_as_their_codes():
    """The cupy backend's FP8 weights: E4M3FN codes of round_e4m3's values, all 255 non-NaN codes."""
    codes = np.arange(256, dtype=np.uint8)
    exponent, mantissa = (codes & 0x7f) >> 3, (codes & 7).astype(np.float64)
    magnitude = np.where(exponent == 0, mantissa / 8 * 2.0 ** -6, (1 + mantissa / 8) * 2.0 ** (exponent - 7.0))
    values = np.where(codes & 0x80, -magnitude, magnitude)
    finite = (codes & 0x7f) != 0x7f
    np.testing.assert_array_equal(cupy_fp8.e4m3_bytes(values[finite]), codes[finite])
    np.testing.assert_array_equal(cupy_fp8.e4m3_bytes(np.array([np.nan, -np.nan, -0.0])), [0x7F, 0xFF, 0x80])
    x = np.random.default_rng(0).uniform(-448, 448, 1000)
    np.testing.assert_array_equal(cupy_fp8.e4m3_bytes(round_e4m3(x)), x.astype(ml_dtypes.float8_e4m3fn).view(np.uint8))
