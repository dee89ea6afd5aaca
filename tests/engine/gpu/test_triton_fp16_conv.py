"""Our Triton convolution kernel in FP16 (ops/triton_conv.fp16_conv_candidates: float16 in and out, products summed in
fp32, bias, residual and ReLU in the epilogue) against the reference kernels on the same float16 values: every
tile it compiles gives the reference's result to fp16 rounding, NaN where the reference has NaN."""
import numpy as np
import pytest

from tftrt_py.engine import Network
from tftrt_py.engine.reference import KERNELS

from gpu_helpers import GPU, healthy_gpu  # noqa: F401 (autouse fixture)

pytestmark = GPU

CASES = {
    # name: (input NHWC, kernel, stride, padding, output channels, residual)
    "1x1_residual_relu": ((2, 7, 7, 64), 1, 1, 0, 128, True),
    "3x3_stride_2": ((2, 9, 9, 64), 3, 2, 1, 64, False),
    "3x3_96_channels": ((1, 6, 6, 96), 3, 1, 1, 32, False),  # 96 channels: steps of 32
}


def layer_and_inputs(case):
    shape, k, stride, pad, cout, residual = CASES[case]
    rng = np.random.default_rng(len(case))
    out = (shape[0], (shape[1] + 2 * pad - k) // stride + 1, (shape[2] + 2 * pad - k) // stride + 1, cout)
    net = Network("fp16_conv")
    ins = [net.add_input("x", "float16", shape)] + ([net.add_input("r", "float16", out)] if residual else [])
    params = dict(strides=[stride] * 2, dilations=[1, 1], pre_padding=[pad] * 2, post_padding=[pad] * 2, groups=1,
                  activation={"type": "relu"})
    kernel = rng.standard_normal((k, k, shape[3], cout)) / np.sqrt(k * k * shape[3])
    weights = {"kernel": kernel.astype(np.float16).astype(np.float32),  # float16 values: the kernel's weights
               "bias": rng.standard_normal(cout).astype(np.float32)}
    layer = net.add_layer("Convolution", ins, params, weights, name="conv")
    values = [rng.standard_normal(shape).astype(np.float16)] + (
        [rng.standard_normal(out).astype(np.float16)] if residual else [])
    values[0][0, 1, 1, 0] = np.nan
    return layer, values, out


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_tile_of_our_fp16_convolution_gives_the_references_result(case):
    import cupy

    from tftrt_py.engine.backends.cupy.ops import BuildOptions, Spec
    from tftrt_py.engine.backends.cupy.ops.conv import conv_candidates

    layer, values, out = layer_and_inputs(case)
    spec = Spec(layer, [v.shape for v in values], ["float16"] * len(values), [out], ["float16"], "float16",
                BuildOptions(), {"op": "triton_conv_fp16"})
    ops = conv_candidates(spec)
    assert ops and {op.tactic["op"] for op in ops} == {"triton_conv_fp16"}
    want = KERNELS["Convolution"](layer, [v.astype(np.float32) for v in values])[0]
    nan = np.isnan(want)
    assert nan.any() and not nan.all()
    for op in ops:
        y = cupy.full(out, 7.0, cupy.float16)
        op.run(None, [cupy.asarray(v) for v in values], [y])
        got = y.get().astype(np.float64)
        np.testing.assert_array_equal(np.isnan(got), nan, err_msg=str(op.tactic))
        err = np.linalg.norm(got[~nan] - want[~nan]) / np.linalg.norm(want[~nan])
        assert err < 1e-3, (op.tactic, err)


def test_a_float32_convolution_keeps_to_cudnn_and_the_gemm_path():
    from tftrt_py.engine.backends.cupy.ops import BuildOptions, Spec
    from tftrt_py.engine.backends.cupy.ops.conv import conv_candidates

    layer, values, out = layer_and_inputs("3x3_stride_2")
    spec = Spec(layer, [values[0].shape], ["float32"], [out], ["float32"], "float32", BuildOptions(), None)
    assert not any(op.tactic["op"].startswith("triton") for op in conv_candidates(spec))
