"""The NaN/Inf suite (tests/reliability/test_nan_inf.py: a TF function per layer kind on inputs holding NaN, ±Inf
and overflowing ±3e38, TF on the CPU as the reference) with its engines on cupy: FP32 as TensorFlow within the
GPU's 1e-4, FP16 with NaN and Inf where TensorFlow has them. Needs TensorFlow beside the GPU (its CPU build
computes the references); tests/engine/gpu/test_nan_inf.py holds cupy to the numpy backend without it."""
import functools

import pytest

pytest.importorskip("tensorflow")

import support  # noqa: E402
from gpu_helpers import GPU, TOL, healthy_gpu  # noqa: F401,E402 (autouse fixture)
from reliability import test_nan_inf as suite  # noqa: E402
from tftrt_py.engine.builder import BuilderConfig  # noqa: E402

pytestmark = GPU


@pytest.fixture(autouse=True)
def engines_on_cupy(monkeypatch):
    monkeypatch.setattr(support, "BuilderConfig", functools.partial(BuilderConfig, backend="cupy"))


@pytest.mark.parametrize("name", sorted(suite.CASES))
def test_fp32_nan_and_inf_as_tensorflow(name):
    suite.check(name, "FP32", fp32_tol=TOL["FP32"])


@pytest.mark.parametrize("name", sorted(set(suite.CASES) - suite.FP32_ONLY))
def test_fp16_keeps_nan_and_inf_positions(name):
    suite.check(name, "FP16")
