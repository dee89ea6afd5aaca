"""INT8 and FP8 Attention layers on the numpy backend (numpy_precision's contract): q, k and v quantized with
their tensors' scales and dequantized (a tensor read as all three once), the attention in fp32 (mask and causal
triangle as in FP32), the output rounded to fp16."""
import ml_dtypes
import numpy as np
import pytest

from networks import ATTENTION_MASKS, quantized_attention_inputs, quantized_attention_net
from tftrt_py.engine import Builder, BuilderConfig
from tftrt_py.engine.backends import numpy_precision

CASES = sorted(ATTENTION_MASKS)
QMAX = {"INT8": 127, "FP8": 448}


def fake_quantized(x: np.ndarray, amax: float, mode: str) -> np.ndarray:
    """x at its quantized values: INT8 x / s rounded half to even and clamped to +-127, FP8 the nearest E4M3FN
    value (ml_dtypes) of x / s clamped to +-448; times s, in fp32."""
    s = amax / QMAX[mode]
    v = np.asarray(x, np.float64) / s
    q = np.clip(np.rint(v), -127, 127) if mode == "INT8" else np.clip(v, -448, 448).astype(ml_dtypes.float8_e4m3fn)
    return q.astype(np.float32) * np.float32(s)


def run(case, mode, values):
    engine = Builder(BuilderConfig(precision=mode)).build_engine(quantized_attention_net(case))
    return engine, engine.create_execution_context().execute(values)["y"]


def ranges(case):
    return {t.name: t.dynamic_range for t in quantized_attention_net(case).inputs}


@pytest.mark.parametrize("mode", ["INT8", "FP8"])
@pytest.mark.parametrize("case", CASES)
def test_quantized_attention_is_the_fp32_attention_of_fake_quantized_q_k_v_rounded_to_fp16(case, mode):
    values = quantized_attention_inputs(case, np.random.default_rng(0))
    engine, got = run(case, mode, values)
    assert engine.network.layers[0].precision == mode
    amax = ranges(case)
    quantized = {n: v if v.dtype == bool else fake_quantized(v, amax[n], mode) for n, v in values.items()}
    _, fp32 = run(case, "FP32", quantized)
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, fp32.astype(np.float16).astype(np.float32))


#: The largest error of quantized attention against FP32, over the output's scale, on inputs within their ranges
#: (measured on seeds 1 to 5: INT8 0.4% to 1.3%, FP8 2.0% to 6.4%; a step is range / 127 in int8, up to 1/16 of
#: a value in E4M3).
BOUNDS = {"INT8": 0.02, "FP8": 0.08}


@pytest.mark.parametrize("mode", ["INT8", "FP8"])
@pytest.mark.parametrize("case", CASES)
def test_quantized_attention_is_within_a_few_steps_of_fp32(case, mode):
    """Inputs within their ranges: rounding errors only."""
    amax = ranges(case)
    values = {n: v if v.dtype == bool else np.clip(v, -amax[n], amax[n])
              for n, v in quantized_attention_inputs(case, np.random.default_rng(1)).items()}
    _, got = run(case, mode, values)
    _, want = run(case, "FP32", values)
    error = float(np.max(np.abs(got - want)) / np.max(np.abs(want)))
    assert 0 < error < BOUNDS[mode], error


@pytest.mark.parametrize("case, quantized", [("fused", 1), ("separate", 3)])
def test_a_tensor_read_as_q_k_and_v_is_quantized_once(monkeypatch, case, quantized):
    calls = []
    quantize = numpy_precision.quantize

    def counting(x, amax, fmt=numpy_precision.FORMATS["INT8"]):
        calls.append(np.shape(x))
        return quantize(x, amax, fmt)

    monkeypatch.setattr(numpy_precision, "quantize", counting)
    run(case, "INT8", quantized_attention_inputs(case, np.random.default_rng(0)))
    assert len(calls) == quantized
