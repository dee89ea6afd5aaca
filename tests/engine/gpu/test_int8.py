"""INT8 Convolution and MatrixMultiply on the cupy backend against the contract, emulated here in numpy,
and against the numpy backend's INT8 kernels (where that backend quantizes): activations quantized with
s = dynamic_range / 127 (round half to even, clamp to +-127), weights per output channel, int32
accumulation, dequantization, bias, residual and activation in fp32, output rounded to fp16. All three
quantize identically, so they agree to 1e-3 (relative L2). Also: missing ranges, int8 tensors between int8
layers, int8 copies beside fp16 outputs, each cuDNN graph variant and the GEMM path, ResNet-50 and a BERT layer
in INT8, and the pinned host staging of the runner."""
import types

import numpy as np
import pytest

from tftrt_py.engine import Builder, BuilderConfig, Engine, Network
from tftrt_py.engine.reference import KERNELS, apply_activation
from tftrt_py.engine.errors import BuildError, MissingDynamicRangeError

import gpu_resnet50 as resnet50
from gpu_calibrate import apply_ranges, max_abs_ranges
from gpu_helpers import GPU, healthy_gpu  # noqa: F401 (autouse fixture)

pytestmark = GPU

rng0 = np.random.default_rng(99)


@pytest.fixture(autouse=True)
def weights_from_the_same_start():
    """Each test draws its weights from a fresh rng0: the same ones whichever tests ran before it (or -k)."""
    global rng0
    rng0 = np.random.default_rng(99)


# -- the contract, in numpy ------------------------------------------------------------------------------
def quantize(x, dynamic_range):
    s = float(dynamic_range) / 127
    return np.clip(np.rint(np.asarray(x, np.float64) / s), -127, 127), s


def quantize_per_channel(w, axis=-1):
    axis = axis % w.ndim
    s = np.max(np.abs(w.astype(np.float64)), axis=tuple(a for a in range(w.ndim) if a != axis), keepdims=True) / 127
    return np.clip(np.rint(w / s), -127, 127), s.reshape(-1)


def fp16(y):
    return y.astype(np.float16).astype(np.float32)


def emulate_conv(layer, x, residual=None):
    xq, sx = quantize(x, layer.inputs[0].dynamic_range)
    wq, sw = quantize_per_channel(layer.weights["kernel"])
    plain = types.SimpleNamespace(params={k: v for k, v in layer.params.items() if k != "activation"},
                                  weights={"kernel": wq.astype(np.float64)},
                                  outputs=[types.SimpleNamespace(dtype="float64")])
    acc = KERNELS["Convolution"](plain, [xq.astype(np.float64)])[0]  # exact integers
    y = (acc * (sx * sw)).astype(np.float32)
    if "bias" in layer.weights:
        y = y + layer.weights["bias"]
    if residual is not None:
        y = y + residual
    return fp16(apply_activation(y.astype(np.float32), layer.params.get("activation")))


def emulate_matmul(layer, a, b, consts=(False, True)):
    p = layer.params
    if p.get("transpose_a"):
        a = np.swapaxes(a, -1, -2)
    if p.get("transpose_b"):
        b = np.swapaxes(b, -1, -2)
    if consts[0]:
        aq, sa = quantize_per_channel(a, axis=-2)
        sa = sa[:, None]
    else:
        aq, sa = quantize(a, layer.inputs[0].dynamic_range)
    bq, sb = quantize_per_channel(b, axis=-1) if consts[1] else quantize(b, layer.inputs[1].dynamic_range)
    y = (np.matmul(aq, bq) * sa * sb).astype(np.float32)
    if "bias" in layer.weights:
        y = y + layer.weights["bias"]
    return fp16(apply_activation(y, p.get("activation")))


def rel_l2(got, ref):
    return float(np.linalg.norm(got.astype(np.float64) - ref) / max(np.linalg.norm(ref), 1e-30))


def int8_engine(net: Network, backend: str = "cupy") -> Engine:
    for layer in net.layers:
        if layer.kind == "Constant":
            layer.precision = None
        else:
            layer.precision = "INT8" if layer.kind in ("Convolution", "MatrixMultiply") else "FP16"
    return Engine(net, precision="INT8", backend=backend, build_config={"strict_types": True})


def numpy_int8(build, inputs):
    """The numpy backend's INT8 output, or None while that backend does not quantize (it then equals FP32)."""
    got = int8_engine(build(), "numpy").create_execution_context().execute(inputs)
    fp32 = Engine(build(), backend="numpy").create_execution_context().execute(inputs)
    if all(np.array_equal(got[k], fp32[k]) for k in got):
        return None
    return got


def check(build, inputs, emulated, what="", tol=1e-3):
    """The cupy INT8 engine against the emulation (and the numpy backend's INT8 when there is one)."""
    engine = int8_engine(build())
    ctx = engine.create_execution_context()
    for run in range(2):  # eager + capture, then a graph replay
        got = ctx.execute(inputs)
        for name, ref in emulated.items():
            err = rel_l2(got[name], ref)
            print(f"{what} {name} run {run}: relative L2 error vs emulation {err:.2e}")
            assert np.isfinite(got[name]).all() and err < tol, (what, name, err)
    reference = numpy_int8(build, inputs)
    if reference is not None:
        for name, ref in reference.items():
            err = rel_l2(got[name], ref)
            print(f"{what} {name}: relative L2 error vs the numpy backend's INT8 {err:.2e}")
            assert err < tol, (what, name, err)
    return engine


def conv_params(k=3, stride=1, pad=1, act=None, nsp=2):
    p = dict(strides=[stride] * nsp, dilations=[1] * nsp, pre_padding=[pad] * nsp, post_padding=[pad] * nsp,
             groups=1)
    if act:
        p["activation"] = act
    return p


def kernel(*shape):
    return (rng0.standard_normal(shape) / np.sqrt(np.prod(shape[:-1]))).astype(np.float32)


CONV_CASES = {
    "3x3_bias_relu": ((2, 9, 9, 16), conv_params(act={"type": "relu"}), (3, 3, 16, 32), False),
    "stem_c3_stride2": ((2, 20, 20, 3), conv_params(k=7, stride=2, pad=3, act={"type": "relu"}), (7, 7, 3, 16), False),
    "stem_same_odd_pairs": ((1, 14, 22, 3), {**conv_params(k=7, stride=2), "pre_padding": [2, 2],
                                             "post_padding": [3, 3]}, (7, 7, 3, 8), False),  # TF's SAME; 22 % 4 == 2
    "stem_3x3_same": ((2, 16, 16, 3), {**conv_params(stride=2, act={"type": "relu"}), "pre_padding": [0, 0],
                                       "post_padding": [1, 1]}, (3, 3, 3, 32), False),
    "1x1": ((2, 7, 7, 64), conv_params(k=1, pad=0), (1, 1, 64, 48), False),
    "residual_relu": ((2, 8, 8, 32), conv_params(act={"type": "relu"}), (3, 3, 32, 32), True),
    "odd_cout_sigmoid": ((1, 6, 6, 24), conv_params(act={"type": "sigmoid"}), (3, 3, 24, 10), False),
    "conv1d": ((2, 20, 16), conv_params(nsp=1), (3, 16, 16), False),
    "same_stride2": ((2, 10, 10, 32), {**conv_params(stride=2, act={"type": "relu"}), "pre_padding": [0, 0],
                                       "post_padding": [1, 1]}, (3, 3, 32, 32), False),  # TF's SAME, even input
}


def conv_case(case):
    shape, params, kshape, residual = CONV_CASES[case]
    weights = {"kernel": kernel(*kshape), "bias": (rng0.standard_normal(kshape[-1]) * 0.1).astype(np.float32)}
    rng = np.random.default_rng(hash(case) % 1000)
    x = rng.standard_normal(shape).astype(np.float32)
    r_shape = shape[:-1] + (kshape[-1],)  # (the residual cases keep the spatial size)

    def build():
        net = Network(f"int8_{case}")
        xt = net.add_input("x", "float32", shape)
        xt.dynamic_range = float(np.max(np.abs(x))) * 0.9  # some values clamp
        ins = [xt] + ([net.add_input("r", "float32", r_shape)] if residual else [])
        layer = net.add_layer("Convolution", ins, params, weights, name="conv")
        net.mark_output(layer.outputs[0], name="y")
        return net

    inputs = {"x": x}
    if residual:
        inputs["r"] = np.random.default_rng(1).standard_normal(r_shape).astype(np.float32)
    net = build()
    emulated = {"y": emulate_conv(net.layers[0], x, inputs.get("r"))}
    return build, inputs, emulated


@pytest.mark.parametrize("case", sorted(CONV_CASES))
def test_int8_convolution(case):
    build, inputs, emulated = conv_case(case)
    engine = check(build, inputs, emulated, case)
    tactic = engine.tactics["conv"]
    assert tactic["op"] in ("cudnn_conv_int8", "gemm_conv_int8", "triton_conv_int8"), tactic
    print(case, tactic)


@pytest.mark.parametrize("case", ["stem_c3_stride2", "stem_same_odd_pairs", "stem_3x3_same"])
def test_an_int8_stem_reads_its_image_quantized_and_folded_by_2x2_pixel_blocks(case):
    build, inputs, emulated = conv_case(case)
    engine = check(build, inputs, emulated, case)
    n, h, w, _ = CONV_CASES[case][0]
    steps = engine.cupy_program.steps
    assert "quantize" in steps[0].layer and steps[1].layer == "conv", [s.layer for s in steps]
    assert engine.cupy_program.slots[steps[0].outputs[0]].shape == (n, h // 2, w // 2, 16)


@pytest.mark.parametrize("variant", ["fused", "fused_i32", "fused_nr", "conv", "gemm", "triton"])
@pytest.mark.parametrize("case", ["residual_relu", "stem_c3_stride2", "stem_same_odd_pairs", "1x1", "same_stride2"])
def test_int8_convolution_each_path(case, variant, monkeypatch):
    """Every cuDNN int8 graph variant, the cuBLAS GEMM path and the Triton kernel (forced), where this GPU has
    it; a stem's each on its image folded by 2x2 pixel blocks."""
    monkeypatch.setenv("TFTRT_PY_INT8_CONV", variant)
    build, inputs, emulated = conv_case(case)
    try:
        engine = check(build, inputs, emulated, f"{case}/{variant}")
    except BuildError as exc:
        if "no GPU implementation" in str(exc):
            pytest.skip(f"no {variant} int8 plan on this GPU: {exc}")
        raise
    tactic = engine.tactics["conv"]
    assert tactic.get("fusion", "gemm") == variant or tactic["op"] == f"{variant}_conv_int8", tactic


@pytest.mark.parametrize("variant", ["fused", "fused_i32", "fused_nr", "conv", "gemm", "triton", None])
def test_int8_tensor_between_int8_convolutions(variant, monkeypatch):
    """conv -> conv: the middle tensor is read only by an int8 layer, so the first writes it as int8
    (requantized after rounding to fp16, except "fused_nr": one step off for ~0.2% of the values)."""
    if variant:
        monkeypatch.setenv("TFTRT_PY_INT8_CONV", variant)
    k1, k2 = kernel(3, 3, 32, 32), kernel(1, 1, 32, 16)
    b1, b2 = (rng0.standard_normal(32) * 0.1).astype(np.float32), (rng0.standard_normal(16) * 0.1).astype(np.float32)
    x = np.random.default_rng(5).standard_normal((2, 10, 10, 32)).astype(np.float32)

    def build():
        net = Network("int8_chain")
        xt = net.add_input("x", "float32", x.shape)
        xt.dynamic_range = float(np.max(np.abs(x)))
        c1 = net.add_layer("Convolution", [xt], conv_params(act={"type": "relu"}), {"kernel": k1, "bias": b1},
                           name="c1")
        c2 = net.add_layer("Convolution", c1.outputs, conv_params(k=1, pad=0), {"kernel": k2, "bias": b2}, name="c2")
        net.mark_output(c2.outputs[0], name="y")
        return net

    net = build()
    mid = emulate_conv(net.layers[0], x)
    net.layers[0].outputs[0].dynamic_range = float(np.max(np.abs(mid))) * 0.8

    def build_with_range():
        n = build()
        n.layers[0].outputs[0].dynamic_range = net.layers[0].outputs[0].dynamic_range
        return n

    emulated = {"y": emulate_conv(net.layers[1], mid)}
    try:
        tol = 5e-3 if variant == "fused_nr" else 1e-3
        engine = check(build_with_range, {"x": x}, emulated, f"chain/{variant}", tol)
    except BuildError as exc:
        if variant and "no GPU implementation" in str(exc):
            pytest.skip(f"no {variant} int8 plan on this GPU: {exc}")
        raise
    slots = engine.cupy_program.slots
    assert slots["c1:0"].dtype == "int8", {k: v.dtype for k, v in slots.items()}
    assert not any(name.startswith("c1:0@") for name in slots)  # no quantize step for it


def two_convolutions(variant, monkeypatch, residual: bool = False, mid_is_output: bool = False, pool=None):
    """The engine of x -> c1 (3x3 relu) -> [max pool `pool`] -> c2 (1x1 relu, with `residual` also adding c1's
    output), c1's output also an engine output when `mid_is_output`, checked against the emulation; skips when
    the forced `variant` has no plan on this GPU."""
    if variant:
        monkeypatch.setenv("TFTRT_PY_INT8_CONV", variant)
    k1, k2 = kernel(3, 3, 32, 32), kernel(1, 1, 32, 32)
    b1, b2 = (rng0.standard_normal(32) * 0.1).astype(np.float32), (rng0.standard_normal(32) * 0.1).astype(np.float32)
    x = np.random.default_rng(6).standard_normal((2, 10, 10, 32)).astype(np.float32)
    ranges = {}

    def build():
        net = Network("int8_two")
        xt = net.add_input("x", "float32", x.shape)
        xt.dynamic_range = float(np.max(np.abs(x)))
        c1 = net.add_layer("Convolution", [xt], conv_params(act={"type": "relu"}), {"kernel": k1, "bias": b1},
                           name="c1")
        c1.outputs[0].dynamic_range = ranges.get("c1:0")
        mid = c1.outputs[0]
        if pool is not None:  # its output with its input's range, as the builder sets it in INT8
            mid = net.add_layer("Pooling", [mid], pool, name="pool").outputs[0]
            mid.dynamic_range = ranges.get("c1:0")
        c2 = net.add_layer("Convolution", [mid] + ([c1.outputs[0]] if residual else []),
                           conv_params(k=1, pad=0, act={"type": "relu"}), {"kernel": k2, "bias": b2}, name="c2")
        net.mark_output(c2.outputs[0], name="y")
        if mid_is_output:
            net.mark_output(c1.outputs[0], name="mid")
        return net

    net = build()
    mid = emulate_conv(net.layers[0], x)
    ranges["c1:0"] = float(np.max(np.abs(mid))) * 0.8
    net = build()
    res = None
    if residual:  # read quantized: rounded to its int8 grid
        q, s = quantize(mid, ranges["c1:0"])
        res = (q * np.float32(s)).astype(np.float32)
    c2_input = KERNELS["Pooling"](net.layers[1], [mid])[0] if pool is not None else mid
    emulated = {"y": emulate_conv(net.layers[-1], c2_input, residual=res)}
    if mid_is_output:
        emulated["mid"] = mid
    try:
        return check(build, {"x": x}, emulated, f"two/{variant}")
    except BuildError as exc:
        if variant and "no GPU implementation" in str(exc):
            pytest.skip(f"no {variant} int8 plan on this GPU: {exc}")
        raise


@pytest.mark.parametrize("variant", ["fused+q", "fused", "conv", "gemm", "triton", None])
def test_int8_tensor_read_by_int8_and_float_layers(variant, monkeypatch):
    """c1 -> c2 (int8 input) with c1's output also an engine output: c1 writes it in fp16 and as int8."""
    engine = two_convolutions(variant, monkeypatch, mid_is_output=True)
    prog = engine.cupy_program  # (c1's output tensor is named after its binding, "mid")
    assert prog.slots["mid"].dtype == "float16" and prog.slots["mid@int8"].dtype == "int8"
    producers = [s for s in prog.steps if "mid@int8" in s.outputs]
    assert len(producers) == 1 and producers[0].layer == "c1", [(s.layer, s.outputs) for s in producers]
    print(variant, engine.tactics["c1"])


@pytest.mark.parametrize("variant", ["gemm", "triton", None])
def test_int8_residual_is_read_as_int8(variant, monkeypatch):
    """c1 -> c2 reading c1's output as its input and as its residual: both reads int8 (TensorRT's int8 residual),
    so c1 writes int8 alone and c2 dequantizes the residual in its epilogue (cuDNN's graphs here take float
    residuals only: not candidates)."""
    engine = two_convolutions(variant, monkeypatch, residual=True)
    prog = engine.cupy_program
    assert prog.slots["c1:0"].dtype == "int8" and not any(name.startswith("c1:0@") for name in prog.slots)
    (step,) = [s for s in prog.steps if s.layer == "c2"]
    assert step.inputs == ["c1:0", "c1:0"], step.inputs
    assert engine.tactics["c2"]["op"] in ("gemm_conv_int8", "triton_conv_int8"), engine.tactics["c2"]


@pytest.mark.parametrize("variant", ["gemm", "triton", None])
def test_int8_residual_of_odd_channels_is_rounded_in_the_epilogue(variant, monkeypatch):
    """A residual with a range but 10 channels (no int8 storage: the quantize step writes 4-byte words) is read in
    fp16 and rounded to its int8 grid inside the convolution's epilogue, as the contract quantizes it."""
    if variant:
        monkeypatch.setenv("TFTRT_PY_INT8_CONV", variant)
    k = kernel(3, 3, 32, 10)
    b = (rng0.standard_normal(10) * 0.1).astype(np.float32)
    rng = np.random.default_rng(12)
    x = rng.standard_normal((2, 8, 8, 32)).astype(np.float32)
    r = rng.standard_normal((2, 8, 8, 10)).astype(np.float32)

    def build():
        net = Network("int8_odd_residual")
        xt, rt = net.add_input("x", "float32", x.shape), net.add_input("r", "float32", r.shape)
        xt.dynamic_range, rt.dynamic_range = float(np.max(np.abs(x))), 2.0  # some residual values clamp
        layer = net.add_layer("Convolution", [xt, rt], conv_params(act={"type": "relu"}), {"kernel": k, "bias": b},
                              name="conv")
        net.mark_output(layer.outputs[0], name="y")
        return net

    q, sr = quantize(fp16(r), 2.0)  # the engine stores the residual binding in fp16, then rounds it to the grid
    emulated = {"y": emulate_conv(build().layers[0], x, residual=(q * np.float32(sr)).astype(np.float32))}
    try:
        engine = check(build, {"x": x, "r": r}, emulated, f"odd_residual/{variant}")
    except BuildError as exc:
        if variant and "no GPU implementation" in str(exc):
            pytest.skip(f"no {variant} int8 plan on this GPU: {exc}")
        raise
    assert not any(slot.dtype == "int8" for name, slot in engine.cupy_program.slots.items() if name.startswith("r"))
    assert engine.tactics["conv"]["op"] in ("gemm_conv_int8", "triton_conv_int8"), engine.tactics["conv"]


def test_max_pool_between_int8_convolutions_pools_int8_values(monkeypatch):
    """c1 -> max pool -> c2: c1 writes int8, the pool takes the max of the int8 values (sixteen channels a thread) and
    writes int8 for c2: no float tensor and no quantize step between them."""
    pool = dict(type="max", window=[3, 3], strides=[2, 2], pre_padding=[1, 1], post_padding=[1, 1])
    engine = two_convolutions(None, monkeypatch, pool=pool)
    prog = engine.cupy_program
    assert prog.slots["c1:0"].dtype == "int8" and prog.slots["pool:0"].dtype == "int8", prog.slots
    assert not any("quantize" in s.layer for s in prog.steps[1:]), [s.layer for s in prog.steps]


@pytest.mark.parametrize("shape", [(2, 6, 6, 3), (1, 5, 5, 3)])  # four pixels a thread, or one
def test_an_rgb_image_is_quantized_to_four_bytes_a_pixel_like_numpy(shape):
    """The quantize step of a stem's float32 image of 3 channels: each pixel's bytes rounded half to even and
    clamped, as quantization.round_int8, the fourth byte 0; NaN gives -127 (the clamp's fmaxf takes -127)."""
    import cupy

    from tftrt_py.engine.backends.cupy.ops.quant import QuantizeOp
    from tftrt_py.engine.quantization import round_int8

    scale = np.float32(0.5)
    x = (np.random.default_rng(27).standard_normal(shape) * 40).astype(np.float32)
    x.reshape(-1)[:7] = [np.nan, np.inf, -np.inf, 0.25, 0.75, -1.25, 63.5]  # ties at half steps
    q = cupy.full(shape[:3] + (4,), 99, cupy.int8)
    QuantizeOp(shape, "float32", scale, 4).run(None, [cupy.asarray(x)], [q])
    want = round_int8(np.nan_to_num(x, nan=-1e9) / scale).astype(np.int8)
    np.testing.assert_array_equal(q.get()[..., :3], want)
    assert not q.get()[..., 3].any()


@pytest.mark.parametrize("shape, dtype", [((2, 6, 8, 3), "float32"), ((1, 4, 6, 3), "float32"),
                                          ((2, 4, 6, 3), "float16"), ((1, 2, 4, 4), "float16")])
def test_an_rgb_image_is_quantized_folded_by_2x2_pixel_blocks(shape, dtype):
    """The quantize step of a folded stem (four pixels a thread where they lie in one row, else one): the bytes
    of the image quantized as it is, each 2x2 block of pixels one pixel of 16 bytes (row in the block, column in
    it, channel)."""
    import cupy

    from tftrt_py.engine.backends.cupy.ops.quant import FOLDED, QuantizeOp

    scale = np.float32(0.5)
    x = (np.random.default_rng(28).standard_normal(shape) * 40).astype(dtype)
    x.reshape(-1)[:4] = [np.nan, np.inf, -np.inf, 0.75]
    rows = cupy.zeros(shape[:3] + (4,), cupy.int8)
    QuantizeOp(shape, dtype, scale, 4).run(None, [cupy.asarray(x)], [rows])
    n, h, w, _ = shape
    q = cupy.full((n, h // 2, w // 2, 16), 99, cupy.int8)
    QuantizeOp(shape, dtype, scale, 4, FOLDED).run(None, [cupy.asarray(x)], [q])
    want = rows.get().reshape(n, h // 2, 2, w // 2, 2, 4).transpose(0, 1, 3, 2, 4, 5).reshape(q.shape)
    np.testing.assert_array_equal(q.get(), want)


@pytest.mark.parametrize("channels", [32, 20])  # sixteen channels a thread, or four
def test_int8_max_pool_takes_the_largest_value_of_each_window_inside_the_image(channels):
    """A 3x3 / 2 max pool of int8 values padded by one: each output the largest of its window's values inside
    the image (padding is not a value), -128 and 127 included."""

    import cupy

    from tftrt_py.engine.backends.cupy.ops.base import Spec
    from tftrt_py.engine.backends.cupy.ops.pooling import PoolOp

    layer = types.SimpleNamespace(name="pool", weights={}, params=dict(
        type="max", window=[3, 3], strides=[2, 2], pre_padding=[1, 1], post_padding=[1, 1]))
    x = np.random.default_rng(26).integers(-128, 128, (2, 9, 9, channels), dtype=np.int8)
    x[0, 0, 0, :2] = -128
    op = PoolOp(Spec(layer, [x.shape], ["int8"], [(2, 5, 5, channels)], ["int8"], "float16", None))
    y = cupy.zeros((2, 5, 5, channels), cupy.int8)
    op.run(None, [cupy.asarray(x)], [y])
    padded = np.pad(x.astype(np.int16), ((0, 0), (1, 1), (1, 1), (0, 0)), constant_values=-1000)
    windows = np.stack([padded[:, i:i + 9:2, j:j + 9:2] for i in range(3) for j in range(3)], axis=-1)
    np.testing.assert_array_equal(y.get(), windows.max(axis=-1))


#: The int8 GEMM ops (cuBLAS, cuBLASLt or our Triton kernel, whichever was faster).
INT8_GEMMS = {"cublas_gemm_int8", "cublaslt_gemm_int8", "triton_gemm_int8"}

MATMUL_CASES = {
    # name: (a shape, b shape, params, b constant)
    "fc_gelu_pad_k": ((37, 70), (70, 50), {"activation": {"type": "gelu_erf"}}, True),
    "fc_gelu_k64": ((2, 37, 64), (64, 48), {"activation": {"type": "gelu_erf"}}, True),  # our Triton GEMM fits
    "fc_batched_a": ((3, 5, 64), (64, 24), {}, True),
    "fc_transpose_b": ((16, 48), (40, 48), {"transpose_b": True}, True),
    "attention_scores": ((2, 3, 17, 24), (2, 3, 19, 24), {"transpose_b": True}, False),
    "attention_values": ((2, 3, 17, 19), (2, 3, 19, 24), {}, False),
    "transposed_a": ((2, 24, 17), (2, 24, 9), {"transpose_a": True}, False),
    "constant_a": ((12, 40), (2, 40, 9), {}, "a"),
}


def matmul_case(case: str, bias: bool = True, b_range: float = 0.95):
    """(build, inputs, emulated outputs) of MATMUL_CASES[case]: random operands, a bias where b is constant (if
    `bias`), and b's dynamic range `b_range` times its max |value| (under 1: saturation is exercised)."""
    sa, sb, params, const = MATMUL_CASES[case]
    a_const, b_const = const == "a", const is True
    rng = np.random.default_rng(len(case))
    a = rng.standard_normal(sa).astype(np.float32)
    b = (rng.standard_normal(sb) / np.sqrt(sb[-2])).astype(np.float32)
    weights = {"bias": (rng.standard_normal(sb[-2] if params.get("transpose_b") else sb[-1]) * 0.1).astype(
        np.float32)} if b_const and bias else {}

    def build():
        net = Network(f"int8_{case}")
        operands = []
        for key, value, is_const in (("a", a, a_const), ("b", b, b_const)):
            if is_const:
                operands.append(net.add_constant(value, name=f"w{key}"))
            else:
                t = net.add_input(key, "float32", value.shape)
                t.dynamic_range = float(np.max(np.abs(value))) * (b_range if key == "b" else 1.0)
                operands.append(t)
        layer = net.add_layer("MatrixMultiply", operands, params, weights, name="mm")
        net.mark_output(layer.outputs[0], name="y")
        return net

    inputs = {k: v for k, v, c in (("a", a, a_const), ("b", b, b_const)) if not c}
    return build, inputs, {"y": emulate_matmul(build().layers[-1], a, b, consts=(a_const, b_const))}


@pytest.mark.parametrize("case", sorted(MATMUL_CASES))
def test_int8_matrix_multiply(case):
    engine = check(*matmul_case(case), case)
    assert engine.tactics["mm"]["op"] in INT8_GEMMS, engine.tactics


@pytest.mark.parametrize("case", ["fc_gelu_k64", "fc_batched_a"])
def test_int8_matrix_multiply_by_weights_in_our_triton_gemm(case, monkeypatch):
    """Activations times constant weights (K a multiple of 32) through our Triton kernel alone: the contract, the
    GELU in the tanh form (within 4.7e-4 of erf's)."""
    monkeypatch.setenv("TFTRT_PY_GEMM", "triton")
    engine = check(*matmul_case(case), case)
    assert engine.tactics["mm"]["op"] == "triton_gemm_int8", engine.tactics


def test_int8_ffn_keeps_its_hidden_tensor_int8_between_our_gemms(monkeypatch):
    """A BERT FFN (dense + GELU -> dense) with a calibrated hidden tensor: no MLP fusion, both products int8 in our
    Triton GEMM, the first writing the hidden tensor as int8 for the second (no float copy, no quantize step);
    what the numpy backend's INT8 computes."""
    from tftrt_py.engine.runtime import deserialize

    monkeypatch.setenv("TFTRT_PY_GEMM", "triton")
    rng = np.random.default_rng(17)
    w1, w2 = ((rng.standard_normal(s) / np.sqrt(s[0])).astype(np.float32) for s in ((64, 128), (128, 64)))

    def build():
        net = Network("int8_ffn")
        x = net.add_input("x", "float32", (48, 64))
        h = net.add_layer("MatrixMultiply", [x, net.add_constant(w1, name="w1")], {"activation": {"type": "gelu_erf"}},
                          {"bias": np.full(128, 0.1, np.float32)}, name="ffn1").outputs[0]
        y = net.add_layer("MatrixMultiply", [h, net.add_constant(w2, name="w2")], {}, name="ffn2").outputs[0]
        net.mark_output(y, name="y")
        x.dynamic_range, h.dynamic_range = 3.0, 2.5
        return net

    engine = Builder(BuilderConfig(precision="INT8", backend="cupy", strict_types=True)).build_engine(build())
    assert engine.tactics["ffn1"]["op"] == engine.tactics["ffn2"]["op"] == "triton_gemm_int8", engine.tactics
    prog = engine.cupy_program
    assert prog.slots["ffn1:0"].dtype == "int8" and not any(name.startswith("ffn1:0@") for name in prog.slots)
    x = {"x": rng.uniform(-3, 3, (48, 64)).astype(np.float32)}
    reference = deserialize(engine.serialize(), backend="numpy").create_execution_context().execute(x)["y"]
    ctx = engine.create_execution_context()
    for run in range(2):
        err = rel_l2(ctx.execute(x)["y"], reference.astype(np.float64))
        print(f"int8 FFN run {run}: relative L2 error vs the numpy backend's INT8 {err:.2e}")
        assert err < 1e-2  # a GELU value the tanh form moves across an int8 rounding boundary changes one step


@pytest.mark.parametrize("y_range, clamp16", [(2.0, True), (1e-6, False)])  # 127 s_y: a normal fp16 value, or not
def test_our_gemm_writes_int8_outputs_as_its_fp16_values_requantized(y_range, clamp16, monkeypatch):
    """The Triton GEMM's int8 output is its fp16 output y requantized: clamp(rint(y / s_y), -127, 127), y / s_y taken
    as y times fp32(1 / s_y), rounded once where the kernel clamps in fp16 (CLAMP16), else to fp32 first; values past
    the range saturate."""
    import cupy

    from tftrt_py.engine.backends import get_backend
    from tftrt_py.engine.backends.cupy.ops import BuildOptions, Spec, triton_conv
    from tftrt_py.engine.backends.cupy.ops.matmul import matmul_candidates
    from tftrt_py.engine.backends.cupy.quant_planning import quant_plan, quant_scale

    monkeypatch.setenv("TFTRT_PY_GEMM", "triton")
    rng = np.random.default_rng(41)
    net = Network("requantize")
    x = net.add_input("x", "float16", (256, 128))
    w = (rng.standard_normal((128, 64)) * y_range / 400).astype(np.float32)  # |y| up to ~3x the range
    layer = net.add_layer("MatrixMultiply", [x, net.add_constant(w, name="w")], {}, name="mm")
    x.dynamic_range, layer.outputs[0].dynamic_range = 127.0, y_range
    quant = quant_plan(layer, "INT8")[1]
    assert triton_conv.clamps_in_fp16("INT8", quant_scale("INT8", y_range)) == clamp16
    opts = BuildOptions()
    opts.tuner = get_backend("cupy")._tuning_context()
    xq = cupy.asarray(rng.integers(-127, 128, (256, 128), dtype=np.int8))
    got = {}
    for dtype in ("float16", "int8"):
        op = matmul_candidates(Spec(layer, [(256, 128)], ["int8"], [(256, 64)], [dtype], "float16", opts,
                                    quant=quant))[0]  # the first tile and grid, for both outputs
        assert op.tactic["op"] == "triton_gemm_int8", op.tactic
        got[dtype] = cupy.empty((256, 64), dtype)
        op.run(opts.tuner, [xq], [got[dtype]])
    y, inv = got["float16"].get().astype(np.float32), np.float32(1) / quant_scale("INT8", y_range)
    product = y.astype(np.float64) * np.float64(inv) if clamp16 else (y * inv).astype(np.float64)
    want = np.clip(np.rint(product), -127, 127)
    assert 0.05 < float((np.abs(want) == 127).mean()) < 0.95, "some values saturate, not all"
    np.testing.assert_array_equal(got["int8"].get().astype(np.float64), want)


def test_every_tile_and_grid_of_our_gemm_computes_the_same_product(monkeypatch):
    """Each kernel of GEMM_TILES with each grid on a product whose rows and channels no tile divides: int8 outputs
    bit for bit those of the first kernel, fp16 outputs within fp16 rounding of the exact product."""
    import cupy

    from tftrt_py.engine.backends import get_backend
    from tftrt_py.engine.backends.cupy.ops import BuildOptions, Spec, triton_conv
    from tftrt_py.engine.backends.cupy.ops.matmul import matmul_candidates
    from tftrt_py.engine.backends.cupy.quant_planning import quant_plan, quant_scale

    monkeypatch.setenv("TFTRT_PY_GEMM", "triton")
    rows, k, n = 300, 256, 352
    rng = np.random.default_rng(43)
    net = Network("tiles")
    x = net.add_input("x", "float16", (rows, k))
    w = (rng.standard_normal((k, n)) / 40).astype(np.float32)
    bias = (rng.standard_normal(n) * 0.1).astype(np.float32)
    layer = net.add_layer("MatrixMultiply", [x, net.add_constant(w, name="w")], {}, {"bias": bias}, name="mm")
    x.dynamic_range, layer.outputs[0].dynamic_range = 127.0, 20.0
    quant = quant_plan(layer, "INT8")[1]
    opts = BuildOptions()
    opts.tuner = get_backend("cupy")._tuning_context()
    xq = rng.integers(-127, 128, (rows, k), dtype=np.int8)
    wq, sw = quantize_per_channel(w)
    exact = fp16(xq.astype(np.float64) @ wq * sw + bias)
    first = None
    for dtype in ("int8", "float16"):
        ops = matmul_candidates(Spec(layer, [(rows, k)], ["int8"], [(rows, n)], [dtype], "float16", opts,
                                     quant=quant))
        assert {tuple(op.tactic["tile"][:5]) for op in ops} == set(triton_conv.GEMM_TILES)
        for op in ops:
            got = cupy.full((rows, n), 99, dtype)
            op.run(opts.tuner, [cupy.asarray(xq)], [got])
            got = got.get()
            if dtype == "int8":
                first = got if first is None else first
                np.testing.assert_array_equal(got, first, err_msg=str(op.tactic))
            else:
                np.testing.assert_allclose(got.astype(np.float32), exact, rtol=2e-3, atol=2e-3,
                                           err_msg=str(op.tactic))
    want = np.clip(np.rint(exact / quant_scale("INT8", 20.0)), -127, 127)
    assert np.abs(first.astype(np.float64) - want).max() <= 1  # y rounded to fp16 before its requantization


def test_missing_dynamic_range_names_the_tensor():
    net = Network("no_range")
    x = net.add_input("images", "float32", (1, 8, 8, 16))
    y = net.add_layer("Convolution", [x], conv_params(), {"kernel": kernel(3, 3, 16, 16)}, name="conv").outputs[0]
    net.mark_output(y, name="y")
    with pytest.raises(MissingDynamicRangeError, match="images") as info:
        int8_engine(net)
    assert info.value.tensors == ["images"]


def test_resnet50_int8():
    """ResNet-50 (64x64, batch 2) calibrated by max |value|: INT8 close to FP32 and to the numpy backend's INT8 of
    the same plan, int8 kernels chosen, int8 tensors between int8 layers, and a plan round trip keeps the
    tactics."""
    from tftrt_py.engine import Runtime
    from tftrt_py.engine.runtime import deserialize

    model = resnet50.spec(classes=100)
    rng = np.random.default_rng(11)
    engine = resnet50.calibrated_engine(model, "INT8", rng, strict_types=True)
    ops = [t["op"] for t in engine.tactics.values()]
    assert sum(ops.count(f"{kind}_conv_int8") for kind in ("cudnn", "gemm", "triton")) == 53, engine.tactics
    assert set(ops) & INT8_GEMMS
    assert sum(s.dtype == "int8" for s in engine.cupy_program.slots.values()) > 30
    reference = Engine(resnet50.network(2, 64, model), backend="numpy").create_execution_context()
    ctx = engine.create_execution_context()
    x = {"input": rng.standard_normal((2, 64, 64, 3)).astype(np.float32)}
    ref = reference.execute(x)["logits"]
    for run in range(2):
        got = ctx.execute(x)["logits"]
        err = rel_l2(got, ref)
        print(f"ResNet-50 INT8 run {run}: relative L2 error vs FP32 {err:.3e}")
        assert err < 0.15
    on_cpu = deserialize(engine.serialize(), backend="numpy").create_execution_context()
    err = rel_l2(got, on_cpu.execute(x)["logits"].astype(np.float64))
    print(f"ResNet-50 INT8: relative L2 error vs the numpy backend's INT8 {err:.3e}")
    assert err < 2e-2
    again = Runtime().deserialize_cuda_engine(engine.serialize())
    assert again.tactics == engine.tactics
    assert rel_l2(again.create_execution_context().execute(x)["logits"], ref) < 0.15


def test_int8_convolutions_slower_than_fp16_run_in_fp16():
    """Without strict types each int8 convolution is timed against its fp16 kernel: the slower precision
    loses, the choice is recorded in the tactic and the layer's precision, so the plan runs the same on
    the numpy backend and reloads on this GPU without re-timing."""
    from tftrt_py.engine import Runtime
    from tftrt_py.engine.runtime import deserialize

    model = resnet50.spec(classes=100)
    rng = np.random.default_rng(12)
    engine = resnet50.calibrated_engine(model, "INT8", rng)
    convs = [l for l in engine.network.layers if l.kind == "Convolution"]
    choice = {l.name: engine.tactics[l.name]["int8"] for l in convs}
    assert len(choice) == 53
    for layer in convs:
        int8_op = engine.tactics[layer.name]["op"].endswith("_int8")
        assert int8_op == choice[layer.name] and layer.precision == ("INT8" if int8_op else "FP16"), layer.name
    print(f"ResNet-50 64x64 batch 2: {sum(choice.values())} of 53 convolutions stay int8")
    x = {"input": rng.standard_normal((2, 64, 64, 3)).astype(np.float32)}
    got = engine.create_execution_context().execute(x)["logits"]
    plan = engine.serialize()
    on_cpu = deserialize(plan, backend="numpy").create_execution_context().execute(x)["logits"]
    assert rel_l2(got, on_cpu.astype(np.float64)) < 2e-2
    again = Runtime().deserialize_cuda_engine(plan)
    again.prepare()
    assert again.tactics == engine.tactics


def test_host_arrays_are_staged_through_pinned_buffers():
    import cupy

    build, inputs, emulated = conv_case("3x3_bias_relu")
    ctx = int8_engine(build()).create_execution_context()
    first = ctx.execute(inputs)["y"]
    runner = ctx._runner
    pinned = runner._pinned
    assert pinned and all(isinstance(v, np.ndarray) for v in pinned.values())
    assert all(cupy.cuda.runtime.pointerGetAttributes(v.ctypes.data).type == 1 for v in pinned.values())  # host
    first_copy = first.copy()
    second = ctx.execute({"x": inputs["x"] * 0.5})["y"]
    assert runner._pinned is pinned  # kept for the context's life
    np.testing.assert_array_equal(first, first_copy)  # results are copies, not views of the pinned buffers
    assert not np.array_equal(first, second)
    one = ctx.execute({"x": inputs["x"][:1]})["y"]
    np.testing.assert_allclose(one, first[:1], rtol=1e-6, atol=1e-6)


def test_bert_layer_int8():
    """A small BERT layer in INT8: the QKV and output projections with int8 weights, the fused attention on int8
    q, k and v, LayerNorms in FP16; close to FP32."""
    import gpu_bert as bert

    model = bert.spec(hidden=64, heads=4, ffn=256)
    rng = np.random.default_rng(13)

    def build():
        return bert.network(2, 32, model, dtype="float32")

    ranges = max_abs_ranges(build, [{"x": rng.standard_normal((2, 32, 64)).astype(np.float32)} for _ in range(2)])
    engine = Builder(BuilderConfig(precision="INT8", backend="cupy", strict_types=True)).build_engine(
        apply_ranges(build(), ranges))  # strict: this small layer's GEMMs are faster in fp16
    ops = [t["op"] for t in engine.tactics.values()]
    assert sum(op in INT8_GEMMS for op in ops) >= 2, engine.tactics  # QKV and output projections
    x = {"x": rng.standard_normal((2, 32, 64)).astype(np.float32)}
    ref = Engine(build(), backend="numpy").create_execution_context().execute(x)["y"]
    got = engine.create_execution_context().execute(x)["y"]
    err = rel_l2(got, ref)
    print(f"BERT layer INT8: relative L2 error vs FP32 {err:.3e}; ops {sorted(set(ops))}")
    assert err < 0.1


@pytest.mark.parametrize("precision, storage", [("INT8", "int8"), ("FP8", "uint8")])
@pytest.mark.parametrize("width", [96, 33024])  # one pass; rows too long for it: three passes, then a quantize step
@pytest.mark.parametrize("rows", [False, True])
def test_a_layernorm_read_by_a_quantized_gemm_writes_its_output_quantized_too(precision, storage, width, rows):
    """x + r -> LayerNorm -> (output, dense): the LayerNorm writes its output in fp16 and quantized (no quantize
    step between it and the dense layer), and the dense layer computes from those bytes what the contract gives
    for the engine's own LayerNorm output (INT8: emulated here; FP8: the numpy backend's). With `rows`, the
    LayerNorm's output is [1, 5, width] and the dense layer reads it reshaped to [5, width] (as a converted Dense
    layer reads a sequence): through a view of the quantized bytes."""
    import cupy

    from tftrt_py.engine.runtime import deserialize

    if precision == "FP8" and int(cupy.cuda.Device().compute_capability) < 89:
        pytest.skip("FP8 needs compute capability 8.9")
    rng = np.random.default_rng(31)
    net = Network(f"ln_{precision}")
    shape = (1, 5, width) if rows else (5, width)
    x, r = (net.add_input(n, "float32", shape) for n in ("x", "r"))
    ln = net.add_layer("Normalization", [x, r], {"epsilon": 1e-6},
                       {"scale": rng.uniform(0.5, 1.5, width).astype(np.float32),
                        "bias": rng.uniform(-0.2, 0.2, width).astype(np.float32)}, name="ln")
    h = ln.outputs[0]
    read = net.add_layer("Shuffle", [h], {"reshape": [5, width]}, name="rows").outputs[0] if rows else h
    w = (rng.standard_normal((width, 16)) / np.sqrt(width)).astype(np.float32)
    dense = net.add_layer("MatrixMultiply", [read, net.add_constant(w, name="w")], {}, name="dense")
    net.mark_output(h, name="h")
    net.mark_output(dense.outputs[0], name="y")
    x.dynamic_range = h.dynamic_range = read.dynamic_range = 4.0
    engine = Builder(BuilderConfig(precision=precision, backend="cupy", strict_types=True)).build_engine(net)
    prog = engine.cupy_program
    assert prog.slots[f"h@{precision.lower()}"].dtype == storage, prog.slots  # (h: the output's name)
    assert [s.layer for s in prog.steps if "quantize" in s.layer] == [], [s.layer for s in prog.steps]
    if rows:
        assert prog.root(f"{read.name}@{precision.lower()}").name == f"h@{precision.lower()}", prog.slots
    dense = {layer.name: layer for layer in engine.network.layers}["dense"]
    assert dense.precision == precision
    feed = {"x": rng.uniform(-3, 3, shape).astype(np.float32),
            "r": rng.uniform(-1, 1, shape).astype(np.float32)}
    got = engine.create_execution_context().execute(feed)
    if precision == "INT8":
        want = emulate_matmul(dense, got["h"].astype(np.float32).reshape(5, width), w)
        tol = 1e-3
    else:
        want = deserialize(engine.serialize(), backend="numpy").create_execution_context().execute(feed)["y"]
        tol = 5e-2
    err = rel_l2(got["y"], want.astype(np.float64))
    print(f"{precision} LayerNorm -> dense (width {width}): relative L2 error {err:.2e}")
    assert err < tol
