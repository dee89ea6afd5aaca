"""A float16 convolution of few input channels (an RGB image's stem) may run a cuDNN plan on its input copied with
zero channels after the real ones (to 4 or 8, as timed: ResNet-50's stem got a faster plan at 4). That copy also
converts, so the cast of an fp32 image before it goes where the convolution alone reads the cast: its output
matches the numpy backend's, NaN and Inf pixels included, with the cast or without it."""
from __future__ import annotations

import numpy as np
import pytest

from tftrt_py.engine import Engine, Network
from tftrt_py.engine.backends.cupy.ops import FACTORIES
from tftrt_py.engine.backends.cupy.ops.conv import conv_candidates

from gpu_helpers import GPU, assert_close_with_nonfinite, cupy_engine, healthy_gpu  # noqa: F401 (autouse fixture)

pytestmark = GPU

SHAPE = (2, 32, 32, 3)


def stem(dtype="float32", pooled_too=False):
    """x -> 7x7/2 convolution (padding 3, ReLU) to 16 channels; with `pooled_too` a max pool reads x as well."""
    rng = np.random.default_rng(0)
    net = Network("stem")
    x = net.add_input("x", dtype, SHAPE)
    params = dict(strides=[2, 2], dilations=[1, 1], pre_padding=[3, 3], post_padding=[3, 3], groups=1,
                  activation={"type": "relu"})
    weights = {"kernel": (rng.standard_normal((7, 7, 3, 16)) * 0.2).astype(np.float32),
               "bias": (rng.standard_normal(16) * 0.1).astype(np.float32)}
    net.mark_output(net.add_layer("Convolution", [x], params, weights, name="stem").outputs[0], name="y")
    if pooled_too:
        pool = net.add_layer("Pooling", [x], dict(type="max", window=[2, 2], strides=[2, 2], pre_padding=[0, 0],
                                                  post_padding=[0, 0]), name="pool")
        net.mark_output(pool.outputs[0], name="p")
    return net


def padded_to(cp, monkeypatch):
    """Offer the tuner only cuDNN plans on the input padded to `cp` channels."""
    monkeypatch.setitem(FACTORIES, "Convolution",
                        lambda spec: [op for op in conv_candidates(spec) if op.tactic.get("pad_c") == cp])


def reference(net_fn, x):
    return Engine(net_fn(), precision="FP32", backend="numpy").create_execution_context().execute(x)


def image(seed, dtype=np.float32):
    return {"x": np.random.default_rng(seed).standard_normal(SHAPE).astype(dtype)}


def casts(engine):
    return [s.layer for s in engine.cupy_program.steps if s.layer.endswith("(cast)")]


@pytest.mark.parametrize("cp", [4, 8])
def test_a_padding_plan_reads_the_fp32_image_without_a_cast(cp, monkeypatch):
    padded_to(cp, monkeypatch)
    engine = cupy_engine(stem(), "FP16")
    assert engine.tactics["stem"]["pad_c"] == cp, engine.tactics["stem"]
    assert not casts(engine), casts(engine)
    (step,) = [s for s in engine.cupy_program.steps if s.layer == "stem"]
    assert step.inputs == ["x"], step.inputs
    ctx = engine.create_execution_context()
    for seed in (1, 2):  # the first run eager, then the CUDA graph's replay
        x = image(seed)
        assert_close_with_nonfinite(ctx.execute(x)["y"], reference(stem, x)["y"], "FP16", f"run {seed}")


def test_nan_and_inf_pixels_reach_the_outputs_whose_windows_hold_them(monkeypatch):
    padded_to(4, monkeypatch)
    engine = cupy_engine(stem(), "FP16")
    x = image(3)
    x["x"][0, 5, 6, 1] = np.nan
    x["x"][1, 20, 9, 0] = np.inf
    x["x"][1, 0, 31, 2] = -np.inf
    got, ref = engine.create_execution_context().execute(x)["y"], reference(stem, x)["y"]
    assert np.isnan(ref).any() and np.isinf(ref).any()
    assert_close_with_nonfinite(got, ref, "FP16", "NaN and Inf pixels")


def test_the_cast_stays_where_another_layer_reads_it(monkeypatch):
    padded_to(4, monkeypatch)
    engine = cupy_engine(stem(pooled_too=True), "FP16")
    assert engine.tactics["stem"]["pad_c"] == 4
    assert casts(engine), [s.layer for s in engine.cupy_program.steps]
    x = image(4)
    got, ref = engine.create_execution_context().execute(x), reference(lambda: stem(pooled_too=True), x)
    for name in ("y", "p"):
        assert_close_with_nonfinite(got[name], ref[name], "FP16", name)


def test_a_float16_image_is_padded_as_it_is(monkeypatch):
    padded_to(4, monkeypatch)
    engine = cupy_engine(stem("float16"), "FP16")
    assert engine.tactics["stem"]["pad_c"] == 4 and not casts(engine)
    x = image(5, np.float16)
    assert_close_with_nonfinite(engine.create_execution_context().execute(x)["y"],
                                reference(lambda: stem("float16"), x)["y"], "FP16", "float16 image")
