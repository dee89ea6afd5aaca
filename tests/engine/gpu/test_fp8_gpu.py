"""precision FP8 on the cupy backend: E4M3 convolutions (our Triton kernel, cuDNN with dequantize/bias/residual/
activation fused, or cuDNN's sums and our epilogue) and matrix multiplies (cuBLASLt) computing what the numpy
backend's FP8 emulation computes, within fp16 rounding and accumulation order, on fresh random inputs with
NaN-poisoned buffers, CUDA-graph replays equal to the eager run; E4M3 tensors between FP8 layers (written by their
producer, read as residuals too); without strict types each FP8 layer runs FP8 only where that is faster than FP16
(recorded in its tactic and precision); below compute capability 8.9 the build fails saying what to use instead."""
import numpy as np
import pytest

from tftrt_py.engine import Builder, BuilderConfig, Network
from tftrt_py.engine.errors import BuildError
from tftrt_py.engine.runtime import deserialize

import gpu_resnet50 as resnet50
from gpu_helpers import GPU, healthy_gpu  # noqa: F401 (autouse fixture)

pytestmark = GPU


def conv_params(act=None):
    return dict(strides=[1, 1], dilations=[1, 1], pre_padding=[1, 1], post_padding=[1, 1], groups=1,
                activation={"type": act} if act else None)


def fp8_net(batch=8):
    """conv(bias, relu) -> conv(bias, + residual, relu) -> mean -> dense (bias) -> batched x @ x^T."""
    rng = np.random.default_rng(3)
    net = Network("fp8_net")
    x = net.add_input("x", "float32", (batch, 16, 16, 32))
    c1 = net.add_layer("Convolution", [x], conv_params("relu"),
                       {"kernel": (rng.standard_normal((3, 3, 32, 32)) * 0.1).astype("float32"),
                        "bias": rng.standard_normal(32).astype("float32")}, name="conv1")
    c2 = net.add_layer("Convolution", [c1.outputs[0], c1.outputs[0]], conv_params("relu"),
                       {"kernel": (rng.standard_normal((3, 3, 32, 32)) * 0.1).astype("float32"),
                        "bias": rng.standard_normal(32).astype("float32")}, name="conv2")
    mean = net.add_layer("Reduce", c2.outputs, dict(op="mean", axes=[1, 2], keep_dims=False), name="mean")
    w = net.add_constant(rng.standard_normal((32, 64)).astype("float32"), name="w")
    mm = net.add_layer("MatrixMultiply", [mean.outputs[0], w], {}, name="dense")
    net.mark_output(mm.outputs[0], name="y")
    x.dynamic_range = 4.0
    c1.outputs[0].dynamic_range = 8.0
    mean.outputs[0].dynamic_range = 4.0
    return net


#: Max error over max(1, |ref|) through three chained FP8 layers: a value that fp16 summation order moves across
#: an E4M3 rounding boundary changes by one step (1/16 to 1/8 of itself) in the next layer's operand (measured on
#: an H100: 1.8e-2 on one row of 16, the other rows equal).
TOL = 5e-2


def rel_err(got, ref):
    ref = ref.astype(np.float64)
    return float(np.max(np.abs(got.astype(np.float64) - ref)) / max(1.0, float(np.max(np.abs(ref)))))


def fp8_capable():
    import cupy

    return int(cupy.cuda.Device().compute_capability) >= 89


CONV_OPS = ("cudnn_conv_fp8", "triton_conv_fp8")


def against_numpy(engine, inputs, runs=3):
    """The engine's outputs on fresh random `inputs()` against the same plan on the numpy backend (max error over
    max(1, |ref|) below TOL), and a graph replay equal to the eager run."""
    ctx = engine.create_execution_context()
    on_cpu = deserialize(engine.serialize(), backend="numpy").create_execution_context()
    first = None
    for run in range(runs):
        feed = inputs()
        got, want = ctx.execute(feed), on_cpu.execute(feed)
        for name in want:
            assert np.isfinite(got[name]).all()
            assert rel_err(got[name], want[name]) < TOL, (run, name, rel_err(got[name], want[name]))
        first = first or (feed, got)
    again = ctx.execute(first[0])
    for name in again:
        np.testing.assert_array_equal(again[name], first[1][name])


def fp8_pair(variant, monkeypatch, residual=False, mid_is_output=False, cout=32):
    """Strict FP8 engine of x -> c1 (3x3 relu) -> c2 (1x1 relu, with `residual` also adding c1's output), c1's
    output also an engine output when `mid_is_output`; the convolutions forced to `variant` ("triton", "fused",
    "conv" or None: the fastest). Skips below compute capability 8.9 and where the variant has no kernel."""
    if not fp8_capable():
        pytest.skip("FP8 needs compute capability 8.9")
    if variant:
        monkeypatch.setenv("TFTRT_PY_FP8_CONV", variant)
    rng = np.random.default_rng(21)
    net = Network("fp8_pair")
    x = net.add_input("x", "float32", (2, 10, 10, 32))
    c1 = net.add_layer("Convolution", [x], conv_params("relu"),
                       {"kernel": (rng.standard_normal((3, 3, 32, 32)) * 0.1).astype("float32"),
                        "bias": rng.standard_normal(32).astype("float32")}, name="c1")
    c2 = net.add_layer("Convolution", [c1.outputs[0]] + ([c1.outputs[0]] if residual else []),
                       dict(conv_params("relu"), pre_padding=[0, 0], post_padding=[0, 0]),
                       {"kernel": (rng.standard_normal((1, 1, 32, cout)) * 0.1).astype("float32"),
                        "bias": rng.standard_normal(cout).astype("float32")}, name="c2")
    net.mark_output(c2.outputs[0], name="y")
    if mid_is_output:
        net.mark_output(c1.outputs[0], name="mid")
    x.dynamic_range, c1.outputs[0].dynamic_range = 4.0, 6.0  # some of c1's values saturate
    try:
        engine = Builder(BuilderConfig(precision="FP8", backend="cupy", strict_types=True)).build_engine(net)
    except BuildError as exc:
        if variant and "no GPU implementation" in str(exc):
            pytest.skip(f"no {variant} FP8 kernel on this GPU: {exc}")
        raise
    rng = np.random.default_rng(22)
    against_numpy(engine, lambda: {"x": rng.uniform(-4, 4, (2, 10, 10, 32)).astype("float32")})
    for name in ("c1", "c2"):
        op = engine.tactics[name]
        assert op["op"] in CONV_OPS and (variant is None or op["op"] == f"{variant}_conv_fp8"
                                         or op.get("fusion") == variant), (name, op)
    return engine


@pytest.mark.parametrize("variant", ["triton", "conv", None])
def test_fp8_tensor_between_fp8_convolutions_stays_e4m3(variant, monkeypatch):
    """c1 -> c2: c1 writes its output as E4M3 bytes (from its epilogue), c2 reads them: no float tensor, no
    quantize step between them."""
    prog = fp8_pair(variant, monkeypatch).cupy_program
    assert prog.slots["c1:0"].dtype == "uint8" and not any(name.startswith("c1:0@") for name in prog.slots)


@pytest.mark.parametrize("variant", ["triton", "conv", None])
def test_fp8_residual_is_read_as_e4m3(variant, monkeypatch):
    """c2 reads c1's output as its input and as its residual, both E4M3 (the contract rounds a residual with a
    range to its grid), so c1 writes E4M3 alone."""
    engine = fp8_pair(variant, monkeypatch, residual=True)
    prog = engine.cupy_program
    assert prog.slots["c1:0"].dtype == "uint8" and not any(name.startswith("c1:0@") for name in prog.slots)
    (step,) = [s for s in prog.steps if s.layer == "c2"]
    assert step.inputs == ["c1:0", "c1:0"], step.inputs


@pytest.mark.parametrize("variant", ["triton", "fused", "conv", None])
def test_fp8_tensor_read_by_fp8_and_float_layers_is_written_twice(variant, monkeypatch):
    """c1's output is also an engine output: c1 writes it in fp16 and as E4M3 (for c2)."""
    prog = fp8_pair(variant, monkeypatch, mid_is_output=True).cupy_program
    assert prog.slots["mid"].dtype == "float16" and prog.slots["mid@fp8"].dtype == "uint8"
    producers = [s.layer for s in prog.steps if "mid@fp8" in s.outputs]
    assert producers == ["c1"], producers


@pytest.mark.parametrize("variant", ["triton", "conv"])
def test_fp8_residual_of_odd_channels_is_rounded_in_the_epilogue(variant, monkeypatch):
    """A residual with a range but 10 channels (no E4M3 storage: the quantize step writes 4-byte words) is read
    in fp16 and rounded to its E4M3 grid inside the convolution's epilogue."""
    if not fp8_capable():
        pytest.skip("FP8 needs compute capability 8.9")
    monkeypatch.setenv("TFTRT_PY_FP8_CONV", variant)
    rng = np.random.default_rng(23)
    net = Network("fp8_odd_residual")
    x, r = net.add_input("x", "float32", (2, 8, 8, 32)), net.add_input("r", "float32", (2, 8, 8, 10))
    x.dynamic_range, r.dynamic_range = 4.0, 2.0  # some residual values saturate
    layer = net.add_layer("Convolution", [x, r], conv_params("relu"),
                          {"kernel": (rng.standard_normal((3, 3, 32, 10)) * 0.1).astype("float32"),
                           "bias": rng.standard_normal(10).astype("float32")}, name="conv")
    net.mark_output(layer.outputs[0], name="y")
    engine = Builder(BuilderConfig(precision="FP8", backend="cupy", strict_types=True)).build_engine(net)
    against_numpy(engine, lambda: {"x": rng.uniform(-4, 4, (2, 8, 8, 32)).astype("float32"),
                                   "r": rng.uniform(-3, 3, (2, 8, 8, 10)).astype("float32")})
    assert engine.tactics["conv"]["op"] in CONV_OPS, engine.tactics["conv"]
    assert not any(s.dtype == "uint8" for name, s in engine.cupy_program.slots.items() if name.startswith("r"))


def test_resnet50_fp8():
    """ResNet-50 (64x64, batch 2) calibrated by max |value|, strict FP8: every convolution an E4M3 kernel, E4M3
    tensors between them, the numpy backend's FP8 close to it and as far from FP32 (so accuracy measured on the CPU
    predicts the GPU's; Hopper's FP8 sums are not exact fp32, and an E4M3 step is 1/16 of a value: measured 3.5e-2
    apart), a plan round trip keeping the tactics."""
    from tftrt_py.engine import Engine, Runtime

    if not fp8_capable():
        pytest.skip("FP8 needs compute capability 8.9")
    model = resnet50.spec(classes=100)
    rng = np.random.default_rng(24)
    engine = resnet50.calibrated_engine(model, "FP8", rng, strict_types=True)
    ops = [t["op"] for t in engine.tactics.values()]
    assert sum(ops.count(op) for op in CONV_OPS) == 53, engine.tactics
    assert sum(s.dtype == "uint8" for s in engine.cupy_program.slots.values()) > 30
    x = {"input": rng.standard_normal((2, 64, 64, 3)).astype(np.float32)}
    got = engine.create_execution_context().execute(x)["logits"].astype(np.float64)
    on_cpu = deserialize(engine.serialize(), backend="numpy").create_execution_context().execute(x)["logits"]
    fp32 = Engine(resnet50.network(2, 64, model), backend="numpy").create_execution_context().execute(x)["logits"]

    def rel_l2(a, b):
        return float(np.linalg.norm(a - b) / np.linalg.norm(b))

    print(f"ResNet-50 FP8 relative L2: GPU vs numpy FP8 {rel_l2(got, on_cpu):.3e}, GPU vs FP32 "
          f"{rel_l2(got, fp32):.3e}, numpy FP8 vs FP32 {rel_l2(on_cpu, fp32):.3e}")
    assert rel_l2(got, on_cpu) < 5e-2
    assert rel_l2(got, fp32) < 1.5 * rel_l2(on_cpu, fp32) + 1e-2
    again = Runtime().deserialize_cuda_engine(engine.serialize())
    assert again.tactics == engine.tactics


def test_fp8_needs_compute_capability_8_9():
    if fp8_capable():
        engine = Builder(BuilderConfig(precision="FP8", backend="cupy", strict_types=True)).build_engine(fp8_net())
        assert engine.create_execution_context() is not None
        return
    with pytest.raises(BuildError, match="precision FP8 needs a GPU of compute capability 8.9 or later"):
        Builder(BuilderConfig(precision="FP8", backend="cupy")).build_engine(fp8_net()).create_execution_context()


@pytest.mark.parametrize("batch", [16, 2])
def test_fp8_layers_match_the_numpy_emulation(batch):
    """Strict types: every FP8 layer runs E4M3 kernels; the same plan on the numpy backend computes the same
    (fresh random inputs each run: eager, capture, two graph replays; the replay of an input equals its eager run)."""
    if not fp8_capable():
        pytest.skip("FP8 needs compute capability 8.9")
    engine = Builder(BuilderConfig(precision="FP8", backend="cupy", strict_types=True)).build_engine(fp8_net(batch))
    ctx = engine.create_execution_context()
    layers = {l.name: l for l in engine.network.layers}
    for name, ops in (("conv1", CONV_OPS), ("conv2", CONV_OPS), ("dense", ("cublaslt_gemm_fp8", "triton_gemm_fp8"))):
        print(name, layers[name].precision, engine.tactics[name])
        assert layers[name].precision == "FP8" and engine.tactics[name]["op"] in ops, (name, engine.tactics[name])
    assert engine.cupy_program.slots["conv1:0"].dtype == "uint8"  # conv2 reads it (and its residual) as E4M3
    on_cpu = deserialize(engine.serialize(), backend="numpy").create_execution_context()
    rng = np.random.default_rng(4)
    first = None
    for run in range(4):
        x = rng.uniform(-4, 4, (batch, 16, 16, 32)).astype("float32")
        got, want = ctx.execute({"x": x})["y"], on_cpu.execute({"x": x})["y"]
        assert np.isfinite(got).all()
        assert rel_err(got, want) < TOL, (run, rel_err(got, want))
        first = first or (x, got.copy())
    np.testing.assert_array_equal(ctx.execute({"x": first[0]})["y"], first[1])  # a graph replay equals eager


def test_fp8_quantize_step_rounds_like_numpy():
    """The E4M3 quantize kernel gives numpy_precision.round_e4m3's codes (ties to even, saturation, NaN)."""
    if not fp8_capable():
        pytest.skip("FP8 needs compute capability 8.9")
    import cupy

    from tftrt_py.engine.backends.cupy.ops import fp8
    from tftrt_py.engine.backends.cupy.ops.quant import QuantizeOp
    from tftrt_py.engine.quantization import round_e4m3

    rng = np.random.default_rng(5)
    x = (rng.standard_normal((64, 48)) * 200).astype(np.float16)
    x[0, :4] = [np.nan, 1e4, -1e4, 0.0]
    scale = np.float32(0.75)
    q = cupy.full((64, 48), 0x7f, cupy.uint8)
    QuantizeOp(x.shape, "float16", scale, 48, qfunc=fp8.E4M3_Q).run(None, [cupy.asarray(x)], [q])
    want = fp8.e4m3_bytes(round_e4m3(x.astype(np.float32) / scale))
    want[0, 0] = 0x7f  # NaN
    np.testing.assert_array_equal(q.get(), want)


def test_fp8_layers_slower_than_fp16_run_in_fp16():
    """Without strict types each FP8 layer is timed against FP16 (its quantize steps counted): the choice
    is in its tactic (``fp8``) and precision, and the plan runs the same on the numpy backend."""
    if not fp8_capable():
        pytest.skip("FP8 needs compute capability 8.9")
    engine = Builder(BuilderConfig(precision="FP8", backend="cupy")).build_engine(fp8_net())
    for name in ("conv1", "conv2", "dense"):
        layer = next(l for l in engine.network.layers if l.name == name)
        fp8_op = engine.tactics[name]["op"].endswith("_fp8")
        assert engine.tactics[name]["fp8"] == fp8_op and layer.precision == ("FP8" if fp8_op else "FP16"), name
        assert {"name": name, "precision": layer.precision}.items() <= next(
            r for r in engine.inspect() if r["name"] == name).items()
    x = np.random.default_rng(6).uniform(-4, 4, (8, 16, 16, 32)).astype("float32")
    got = engine.create_execution_context().execute({"x": x})["y"]
    want = deserialize(engine.serialize(), backend="numpy").create_execution_context().execute({"x": x})["y"]
    assert rel_err(got, want) < TOL


def e4m3_values(codes):
    """The values of E4M3FN codes (NaN for 0x7f and 0xff)."""
    exponent, mantissa = (codes & 0x7f) >> 3, (codes & 7).astype(np.float64)
    magnitude = np.where(exponent == 0, mantissa / 8 * 2.0 ** -6, (1 + mantissa / 8) * 2.0 ** (exponent - 7.0))
    magnitude = np.where((codes & 0x7f) == 0x7f, np.nan, magnitude)
    return np.where(codes & 0x80, -magnitude, magnitude)


@pytest.mark.parametrize("channels", [16, 12])  # sixteen channels a thread, or four
def test_fp8_max_pool_takes_the_largest_e4m3_value_of_each_window(channels):
    """Pooling E4M3 bytes four channels a word: order by value (negative codes reversed, -0 below +0), NaN
    skipped as the float kernel skips it; a window of NaN alone gives E4M3's lowest value (the float kernel's
    lowest, saturated)."""
    import types

    import cupy

    from tftrt_py.engine.backends.cupy.ops.base import Spec
    from tftrt_py.engine.backends.cupy.ops.pooling import PoolOp

    layer = types.SimpleNamespace(name="pool", weights={}, params=dict(
        type="max", window=[2, 2], strides=[2, 2], pre_padding=[0, 0], post_padding=[0, 0]))
    codes = np.random.default_rng(25).integers(0, 256, (3, 8, 8, channels), dtype=np.uint8)
    codes[0, 0, 0, :4], codes[0, 0, 1, :4], codes[0, 1, 0, :4], codes[0, 1, 1, :4] = 0x80, 0x00, 0xff, 0x7f
    codes[1, :2, :2, :4] = np.array([0x7f, 0xff])[np.random.default_rng(26).integers(0, 2, (2, 2, 4))]
    codes[2, :2, :2, :4] = np.array([0x7f, 0xff, 0xfe])[np.random.default_rng(27).integers(0, 3, (2, 2, 4))]
    op = PoolOp(Spec(layer, [codes.shape], ["uint8"], [(3, 4, 4, channels)], ["uint8"], "float16", None))
    y = cupy.zeros((3, 4, 4, channels), cupy.uint8)
    op.run(None, [cupy.asarray(codes)], [y])
    windows = e4m3_values(codes).reshape(3, 4, 2, 4, 2, channels).transpose(0, 1, 3, 5, 2, 4).reshape(
        3, 4, 4, channels, 4)
    empty = np.isnan(windows).all(axis=-1)
    assert empty[1, 0, 0, :4].all() and empty.sum() <= 8
    got = e4m3_values(y.get())
    np.testing.assert_array_equal(got, np.where(empty, -448.0, np.nanmax(np.where(empty[..., None], 0, windows),
                                                                           axis=-1)))
    assert got[0, 0, 0, 0] == 0.0 and not np.signbit(got[0, 0, 0, 0])  # max(-0, +0, NaNs) is +0


def test_fp8_max_pool_between_fp8_convolutions_pools_e4m3_bytes(monkeypatch):
    """c1 -> max pool -> c2 in FP8: c1 writes E4M3 bytes, the pool takes their max and writes E4M3 for c2."""
    if not fp8_capable():
        pytest.skip("FP8 needs compute capability 8.9")
    rng = np.random.default_rng(26)
    net = Network("fp8_pool")
    x = net.add_input("x", "float32", (2, 10, 10, 32))
    c1 = net.add_layer("Convolution", [x], conv_params(),  # no activation: negative values pooled too
                       {"kernel": (rng.standard_normal((3, 3, 32, 32)) * 0.1).astype("float32")}, name="c1")
    pool = net.add_layer("Pooling", c1.outputs, dict(type="max", window=[3, 3], strides=[2, 2], pre_padding=[1, 1],
                                                     post_padding=[1, 1]), name="pool")
    c2 = net.add_layer("Convolution", pool.outputs, dict(conv_params("relu"), pre_padding=[0, 0], post_padding=[0, 0]),
                       {"kernel": (rng.standard_normal((1, 1, 32, 32)) * 0.1).astype("float32")}, name="c2")
    net.mark_output(c2.outputs[0], name="y")
    x.dynamic_range, c1.outputs[0].dynamic_range = 4.0, 6.0
    engine = Builder(BuilderConfig(precision="FP8", backend="cupy", strict_types=True)).build_engine(net)
    against_numpy(engine, lambda: {"x": rng.uniform(-4, 4, (2, 10, 10, 32)).astype("float32")})
    prog = engine.cupy_program
    assert prog.slots["c1:0"].dtype == "uint8" and prog.slots["pool:0"].dtype == "uint8", prog.slots
    assert not any("quantize" in s.layer for s in prog.steps[1:]), [s.layer for s in prog.steps]


def fp8_stem(variant, monkeypatch, shape=(2, 32, 32, 3), kernel=7, pad=3, pooled=False):
    """Strict FP8 engine of a stem on an RGB image (kernel x kernel, stride 2, padding `pad`, ReLU; where `pooled`
    its output max-pooled 3x3/2 into a 1x1 convolution, so the stem and the pool write E4M3), on `variant`'s path;
    skips where this GPU has none."""
    if not fp8_capable():
        pytest.skip("FP8 needs compute capability 8.9")
    monkeypatch.setenv("TFTRT_PY_FP8_CONV", variant)
    rng = np.random.default_rng(27)
    net = Network("fp8_stem")
    x = net.add_input("x", "float32", shape)
    layer = net.add_layer("Convolution", [x], dict(strides=[2, 2], dilations=[1, 1], pre_padding=[pad, pad],
                                                   post_padding=[pad, pad], groups=1, activation={"type": "relu"}),
                          {"kernel": (rng.standard_normal((kernel, kernel, shape[-1], 64)) * 0.1).astype("float32"),
                           "bias": rng.standard_normal(64).astype("float32")}, name="conv")
    y = layer.outputs[0]
    if pooled:
        pool = net.add_layer("Pooling", [y], dict(type="max", window=[3, 3], strides=[2, 2], pre_padding=[1, 1],
                                                  post_padding=[1, 1]), name="pool")
        last = net.add_layer("Convolution", pool.outputs, dict(strides=[1, 1], dilations=[1, 1], pre_padding=[0, 0],
                                                               post_padding=[0, 0], groups=1),
                             {"kernel": (rng.standard_normal((1, 1, 64, 32)) * 0.1).astype("float32")}, name="c2")
        y.dynamic_range = 8.0
        y = last.outputs[0]
    net.mark_output(y, name="y")
    x.dynamic_range = 4.0
    try:
        return Builder(BuilderConfig(precision="FP8", backend="cupy", strict_types=True)).build_engine(net)
    except BuildError as exc:
        if "no GPU implementation" in str(exc):
            pytest.skip(f"no {variant} FP8 kernel for an RGB image on this GPU: {exc}")
        raise


@pytest.mark.parametrize("variant", ["triton", "fused", "conv"])
def test_fp8_stem_reads_its_image_folded_by_2x2_pixel_blocks(variant, monkeypatch):
    """A stem: the image's 3 channels padded to 4, folded by 2x2 pixel blocks (16 bytes a pixel) as it is quantized,
    7x7 stride 2 run as 4x4 stride 1, on each path this GPU has, followed by the NaN-window step."""
    engine = fp8_stem(variant, monkeypatch)
    assert engine.cupy_program.slots["x@fp8F"].shape == (2, 16, 16, 16)
    assert engine.tactics["conv"]["nan_windows"], engine.tactics["conv"]
    rng = np.random.default_rng(28)
    against_numpy(engine, lambda: {"x": rng.uniform(-4, 4, (2, 32, 32, 3)).astype("float32")})


#: (batch, row, column, channel) of NaN pixels: corners, both parities of row and column (a folded filter's zero
#: weights sit in its first row and column of pixels, which an output's window does not hold), the last row and
#: column, a whole pixel.
NAN_PIXELS = [(0, 0, 0, 0), (0, 10, 10, 1), (0, 11, 20, 2), (0, 20, 13, 0), (1, 31, 31, 2), (1, 0, 17, 1),
              (1, 16, 0, 0), (1, 7, 8, slice(None))]


@pytest.mark.parametrize("variant", ["triton", "fused", "conv"])
@pytest.mark.parametrize("kernel, pad", [(7, 3), (3, 1), (4, 1)])
def test_fp8_stem_nan_pixels_reach_the_outputs_whose_windows_hold_them(variant, kernel, pad, monkeypatch):
    """NaN pixels of a folded stem's image give NaN in every channel of exactly the outputs whose windows (unfolded)
    hold them, as the numpy backend's unfolded convolution computes; the other outputs its finite values. Inf
    saturates to E4M3's largest value unfolded and folded alike."""
    engine = fp8_stem(variant, monkeypatch, kernel=kernel, pad=pad)
    assert engine.tactics["conv"]["nan_windows"], engine.tactics["conv"]
    ctx = engine.create_execution_context()
    on_cpu = deserialize(engine.serialize(), backend="numpy").create_execution_context()
    rng = np.random.default_rng(29)
    for run in range(2):  # eager, then the graph's replay
        x = rng.uniform(-4, 4, (2, 32, 32, 3)).astype("float32")
        for i in rng.permutation(len(NAN_PIXELS))[:6 + run * 2]:
            x[NAN_PIXELS[i]] = np.nan
        x[1, 3, 4, 0], x[0, 25, 2, 1] = np.inf, -np.inf
        got, want = ctx.execute({"x": x})["y"], on_cpu.execute({"x": x})["y"]
        assert np.isnan(want).any() and not np.isnan(want).all()
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want), err_msg=f"run {run}")
        finite = ~np.isnan(want)
        assert rel_err(got[finite], want[finite]) < TOL, (run, rel_err(got[finite], want[finite]))


def test_fp8_stem_of_an_image_of_nan_alone_is_nan_everywhere(monkeypatch):
    engine = fp8_stem("triton", monkeypatch)
    x = np.full((2, 32, 32, 3), np.nan, np.float32)
    x[1, :, :16] = 1.0  # the second image's left half finite: only outputs whose windows reach past it are NaN
    got = engine.create_execution_context().execute({"x": x})["y"]
    want = deserialize(engine.serialize(), backend="numpy").create_execution_context().execute({"x": x})["y"]
    assert np.isnan(got[0]).all() and not np.isnan(want[1]).all()
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))


def test_fp8_stem_nan_pixels_reach_its_max_pool_as_they_do_unfolded(monkeypatch):
    """The stem writes E4M3 for its max pool: the NaN-window step writes E4M3 NaN, which the pool skips as the
    numpy backend's does (a window of NaN alone gives the lowest value)."""
    engine = fp8_stem("triton", monkeypatch, pooled=True)
    prog = engine.cupy_program
    assert prog.slots["conv:0"].dtype == "uint8" and prog.slots["pool:0"].dtype == "uint8", prog.slots
    x = np.random.default_rng(30).uniform(-4, 4, (2, 32, 32, 3)).astype("float32")
    x[0, 8:14, 8:14] = np.nan  # a block of the stem's outputs entirely NaN: pool windows of NaN alone
    x[1, 20, 21, 0] = np.nan
    got = engine.create_execution_context().execute({"x": x})["y"]
    want = deserialize(engine.serialize(), backend="numpy").create_execution_context().execute({"x": x})["y"]
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    assert rel_err(got, want) < TOL


def test_an_fp8_image_with_4_channels_is_read_unfolded(monkeypatch):
    """No padding byte holds a NaN flag: the stem reads the image as it is, 4 bytes a pixel."""
    engine = fp8_stem("triton", monkeypatch, shape=(2, 32, 32, 4))
    assert engine.cupy_program.slots["x@fp8"].shape == (2, 32, 32, 4)
    assert "nan_windows" not in engine.tactics["conv"]
    rng = np.random.default_rng(31)
    against_numpy(engine, lambda: {"x": rng.uniform(-4, 4, (2, 32, 32, 4)).astype("float32")})


@pytest.mark.parametrize("shape, dtype", [((2, 6, 8, 3), "float32"), ((1, 4, 6, 3), "float32"),
                                          ((2, 4, 6, 3), "float16"), ((1, 2, 4, 1), "float32")])
def test_fp8_folded_image_flags_its_nan_pixels_in_their_padding_byte(shape, dtype):
    """The quantize step of a folded FP8 stem (four pixels a thread where they lie in one row, else one): each
    pixel's E4M3 bytes as the unfolded step writes them, folded by 2x2 blocks; a pixel holding NaN in any channel
    written as zeros with its padding byte nonzero (others' padding 0)."""
    if not fp8_capable():
        pytest.skip("FP8 needs compute capability 8.9")
    import cupy

    from tftrt_py.engine.backends.cupy.ops.quant import E4M3_Q, FOLDED, QuantizeOp

    scale = np.float32(0.5)
    x = (np.random.default_rng(32).standard_normal(shape) * 40).astype(dtype)
    x.reshape(-1)[:4] = [np.nan, np.inf, -np.inf, 0.75]
    x[-1, -1, -1, -1] = np.nan
    n, h, w, c = shape
    rows = cupy.zeros((n, h, w, 4), cupy.uint8)
    QuantizeOp(shape, dtype, scale, 4, qfunc=E4M3_Q).run(None, [cupy.asarray(x)], [rows])
    want = rows.get()
    nan = np.isnan(x).any(axis=-1)
    want[nan] = [0, 0, 0, 0x38]
    want = want.reshape(n, h // 2, 2, w // 2, 2, 4).transpose(0, 1, 3, 2, 4, 5).reshape(n, h // 2, w // 2, 16)
    q = cupy.full((n, h // 2, w // 2, 16), 99, cupy.uint8)
    QuantizeOp(shape, dtype, scale, 4, FOLDED, E4M3_Q, flag_nan=True).run(None, [cupy.asarray(x)], [q])
    np.testing.assert_array_equal(q.get(), want)


def test_fp8_ffn_keeps_its_hidden_tensor_e4m3_between_our_gemms(monkeypatch):
    """A BERT FFN (dense + GELU -> dense) with a calibrated hidden tensor: both products E4M3 in our Triton GEMM
    (GELU in the tanh form), the first writing the hidden tensor as E4M3 bytes for the second; what the numpy
    backend's FP8 computes."""
    if not fp8_capable():
        pytest.skip("FP8 needs compute capability 8.9")
    monkeypatch.setenv("TFTRT_PY_GEMM", "triton")
    rng = np.random.default_rng(29)
    net = Network("fp8_ffn")
    x = net.add_input("x", "float32", (48, 64))
    w1, w2 = ((rng.standard_normal(s) / np.sqrt(s[0])).astype("float32") for s in ((64, 128), (128, 64)))
    h = net.add_layer("MatrixMultiply", [x, net.add_constant(w1, name="w1")], {"activation": {"type": "gelu_erf"}},
                      {"bias": np.full(128, 0.1, "float32")}, name="ffn1").outputs[0]
    y = net.add_layer("MatrixMultiply", [h, net.add_constant(w2, name="w2")], {}, name="ffn2").outputs[0]
    net.mark_output(y, name="y")
    x.dynamic_range, h.dynamic_range = 3.0, 2.5
    engine = Builder(BuilderConfig(precision="FP8", backend="cupy", strict_types=True)).build_engine(net)
    assert engine.tactics["ffn1"]["op"] == engine.tactics["ffn2"]["op"] == "triton_gemm_fp8", engine.tactics
    assert engine.cupy_program.slots["ffn1:0"].dtype == "uint8"
    against_numpy(engine, lambda: {"x": rng.uniform(-3, 3, (48, 64)).astype("float32")})


def test_fp8_product_read_by_an_fp8_product_stays_e4m3():
    """(a @ b) @ c of three activations: the first product's epilogue writes E4M3 bytes, the second reads them
    (no float tensor, no quantize step between), computing what the numpy backend's FP8 does."""
    if not fp8_capable():
        pytest.skip("FP8 needs compute capability 8.9")
    rng = np.random.default_rng(28)
    net = Network("fp8_products")
    a, b, c = (net.add_input(n, "float32", s) for n, s in (("a", (2, 24, 32)), ("b", (2, 32, 48)),
                                                           ("c", (2, 48, 16))))
    ab = net.add_layer("MatrixMultiply", [a, b], {}, name="ab")
    abc = net.add_layer("MatrixMultiply", [ab.outputs[0], c], {}, name="abc")
    net.mark_output(abc.outputs[0], name="y")
    for t, r in ((a, 2.0), (b, 2.0), (c, 2.0), (ab.outputs[0], 12.0)):
        t.dynamic_range = r
    engine = Builder(BuilderConfig(precision="FP8", backend="cupy", strict_types=True)).build_engine(net)
    assert engine.tactics["ab"]["op"] == engine.tactics["abc"]["op"] == "cublaslt_gemm_fp8", engine.tactics
    prog = engine.cupy_program
    assert prog.slots["ab:0"].dtype == "uint8" and not any(name.startswith("ab:0@") for name in prog.slots)
    against_numpy(engine, lambda: {n: rng.uniform(-2, 2, s).astype("float32") for n, s in
                                   (("a", (2, 24, 32)), ("b", (2, 32, 48)), ("c", (2, 48, 16)))})
