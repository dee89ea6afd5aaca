"""Two 1x1 convolutions in a row run as one kernel (ops/conv_chain.py): a bottleneck's last convolution, with its
residual, and the next block's first, which reads only its output. The chained engine writes what the two
convolutions' own Triton kernels write (int8 and E4M3 codes equal; FP16 within its tolerance of the numpy
backend), keeps the chain through a saved plan, and leaves every other pair apart."""
from __future__ import annotations

import zlib

import numpy as np
import pytest

from tftrt_py.engine import Engine, Network, Profiler, Runtime

from gpu_calibrate import apply_ranges, max_abs_ranges
from gpu_helpers import GPU, assert_close, assert_close_with_nonfinite, healthy_gpu  # noqa: F401 (autouse fixture)

pytestmark = GPU

#: The Triton-only path of each quantized format's convolutions (so chained and apart run the same arithmetic).
FORCE = {"INT8": "TFTRT_PY_INT8_CONV", "FP8": "TFTRT_PY_FP8_CONV"}


def conv(net, inputs, cout, k, name, relu=True):
    """A convolution of `inputs` (the first the image, a second the residual) with He-scaled random weights."""
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    cin = inputs[0].shape[-1]
    params = dict(strides=[1, 1], dilations=[1, 1], pre_padding=[k // 2] * 2, post_padding=[k // 2] * 2, groups=1)
    if relu:
        params["activation"] = {"type": "relu"}
    weights = {"kernel": (rng.standard_normal((k, k, cin, cout)) * np.sqrt(2.0 / (k * k * cin))).astype(np.float32),
               "bias": (rng.standard_normal(cout) * 0.1).astype(np.float32)}
    return net.add_layer("Convolution", list(inputs), params, weights, name=name).outputs[0]


def bottlenecks(shape=(2, 10, 10, 64)):
    """x -> [c0 1x1 64->128 | c1 3x3 64->64 -> c3 1x1 64->128 + c0] -> c4 1x1 128->32 -> c5 1x1 32->128 + c3:
    c3 and c4 chain (c3's output is also c5's residual); c4 and c5 do not (c5 has a residual), nor c0 and c3."""
    net = Network("bottlenecks")
    x = net.add_input("x", "float32", shape)
    c0 = conv(net, [x], 128, 1, "c0", relu=False)
    c3 = conv(net, [conv(net, [x], 64, 3, "c1"), c0], 128, 1, "c3")
    c5 = conv(net, [conv(net, [c3], 32, 1, "c4"), c3], 128, 1, "c5")
    net.mark_output(c5, name="y")
    return net


def inputs(seed, shape=(2, 10, 10, 64)):
    return {"x": np.random.default_rng(seed).standard_normal(shape).astype(np.float32)}


def engine_of(net, precision):
    """Every convolution in `precision` (strict types: none falls back to FP16 where that times faster)."""
    for layer in net.layers:
        layer.precision = precision if layer.kind == "Convolution" else None
    return Engine(net, precision=precision, backend="cupy", build_config={"strict_types": True})


def build(precision, chain, monkeypatch, ranges=None):
    monkeypatch.setenv("TFTRT_PY_CONV_CHAIN", "1" if chain else "0")
    if precision in FORCE:
        monkeypatch.setenv(FORCE[precision], "triton")
    net = bottlenecks()
    if ranges is not None:
        apply_ranges(net, ranges)
    return engine_of(net, precision)


def calibrated(precision):
    if precision == "FP16":
        return None
    return max_abs_ranges(bottlenecks, [inputs(s) for s in range(3)], backend="cupy")


def chain_steps(engine):
    return [s for s in engine.cupy_program.steps if s.op.tactic.get("op", "").startswith("triton_chain")]


@pytest.mark.parametrize("precision", ["INT8", "FP8", "FP16"])
def test_a_bottlenecks_last_convolution_and_the_next_first_run_as_one_kernel(precision, monkeypatch):
    ranges = calibrated(precision)
    chained, apart = build(precision, True, monkeypatch, ranges), build(precision, False, monkeypatch, ranges)
    (step,) = chain_steps(chained)
    assert step.layer == "c3 + c4" and step.outputs == ["c3:0", "c4:0"], (step.layer, step.outputs)
    assert chained.tactics["c3"]["chain"]["op"] == f"triton_chain_{precision.lower()}", chained.tactics["c3"]
    assert chained.tactics["c4"]["chained"] == "c3"
    assert not any(s.layer == "c4" for s in chained.cupy_program.steps)
    profiled = chained.create_execution_context()
    profiled.profiler = Profiler()
    profiled.execute(inputs(9))
    assert "c3 + c4" in profiled.profiler.records and "c4" not in profiled.profiler.records
    assert not chain_steps(apart) and "chain" not in apart.tactics["c3"]
    ctx_c, ctx_a = chained.create_execution_context(), apart.create_execution_context()
    for seed in (10, 11):  # the first run eager, then the CUDA graph's replay
        x = inputs(seed)
        got, ref = ctx_c.execute(x)["y"], ctx_a.execute(x)["y"]
        assert np.isfinite(got).all()
        if precision == "FP16":
            assert_close(got, ref, "FP16", "chained against apart")
        else:  # the same integer sums and epilogues: the same fp16 output
            np.testing.assert_array_equal(got, ref)


def test_nan_and_inf_pixels_reach_the_output_as_they_do_apart(monkeypatch):
    chained, apart = build("FP16", True, monkeypatch), build("FP16", False, monkeypatch)
    x = inputs(12)
    x["x"][0, 1, 2, :] = np.nan
    x["x"][1, 3, 4, 5] = np.inf
    got = chained.create_execution_context().execute(x)["y"]
    ref = apart.create_execution_context().execute(x)["y"]
    assert_close_with_nonfinite(got, ref, "FP16", "chained against apart")


def test_a_saved_plan_keeps_the_chain_without_timing_it(monkeypatch):
    ranges = calibrated("INT8")
    engine = build("INT8", True, monkeypatch, ranges)
    monkeypatch.delenv("TFTRT_PY_CONV_CHAIN")  # the plan's tactics decide, not the setting
    loaded = Runtime().deserialize_cuda_engine(engine.serialize())
    loaded.prepare()
    (step,) = chain_steps(loaded)
    assert step.op.tactic["tile"] == engine.tactics["c3"]["chain"]["tile"]
    x = inputs(13)
    np.testing.assert_array_equal(loaded.create_execution_context().execute(x)["y"],
                                  engine.create_execution_context().execute(x)["y"])


def test_pairs_that_do_not_chain_stay_apart(monkeypatch):
    """A 3x3 first convolution, a second with a residual, a second of 48 channels (not a power of two)."""
    monkeypatch.setenv("TFTRT_PY_CONV_CHAIN", "1")
    net = Network("apart")
    x = net.add_input("x", "float32", (2, 6, 6, 64))
    a = conv(net, [x], 64, 3, "a")
    b = conv(net, [a], 64, 1, "b")
    c = conv(net, [b, a], 64, 1, "c")
    net.mark_output(conv(net, [c], 48, 1, "d"), name="y")
    engine = engine_of(net, "FP16")
    assert not chain_steps(engine), [s.op.tactic for s in engine.cupy_program.steps]


def test_a_chain_that_fails_to_build_leaves_the_layers_apart(monkeypatch):
    from tftrt_py.engine.backends.cupy import program

    def broken(first, second, prefer):
        raise RuntimeError("no kernel")

    monkeypatch.setattr(program, "chain_candidates", broken)
    engine = build("FP16", True, monkeypatch)
    assert not chain_steps(engine) and "chain" not in engine.tactics["c3"]
    assert np.isfinite(engine.create_execution_context().execute(inputs(14))["y"]).all()
