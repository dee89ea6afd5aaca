"""The NaN/Inf suite (tests/reliability/test_nan_inf.py: a TF function per layer kind on inputs holding NaN, ±Inf
and overflowing ±3e38, TF on the CPU as the reference) with its engines on cupy: FP32 as TensorFlow within the
GPU's 1e-4, FP16 with NaN and Inf where TensorFlow has them. Needs TensorFlow beside the GPU (its CPU build
computes the references); tests/engine/gpu/test_nan_inf.py holds cupy to the numpy backend without it."""
import functools

import numpy as np
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


#: CUDA's float arithmetic gives a NaN result the canonical bits 0x7FFFFFFF where x86 keeps its operand's (TensorFlow's
#: own GPU kernels do the same), so a NaN's bits, seen through a bitcast, are compared as "a NaN" only.
BITS_OF_ANY_NAN = {"bitcast"}


@pytest.mark.parametrize("name", sorted(set(suite.CASES) - BITS_OF_ANY_NAN))
def test_fp32_nan_and_inf_as_tensorflow(name):
    suite.check(name, "FP32", fp32_tol=TOL["FP32"])


def _nan_bits(bits):
    return ((bits & 0x7F800000) == 0x7F800000) & ((bits & 0x007FFFFF) != 0)


@pytest.mark.parametrize("name", sorted(BITS_OF_ANY_NAN))
def test_fp32_bitcast_gives_tensorflows_bits_and_a_nan_where_tensorflow_has_one(name):
    _, fn, specs = suite.CASES[name]
    inputs = suite.make_inputs(specs, seed=sum(map(ord, name)))
    _, (got,) = support.run_engine(fn, inputs, "FP32")
    want = suite.references(name, inputs)[0][0]
    nan = _nan_bits(want)
    assert nan.any() and (~nan).any()  # the case holds both
    np.testing.assert_array_equal(_nan_bits(got), nan)
    np.testing.assert_array_equal(got[~nan], want[~nan])


@pytest.mark.parametrize("name", sorted(set(suite.CASES) - suite.FP32_ONLY))
def test_fp16_keeps_nan_and_inf_positions(name):
    suite.check(name, "FP16")
