"""The NaN/Inf suite (tests/reliability/test_nan_inf.py: a TF function per layer kind on inputs holding NaN and
±Inf) with its engines on onnxruntime: FP32 as TensorFlow, FP16 with NaN and Inf where TensorFlow has them."""
import functools

import pytest

import support
from ort_helpers import ORT
from reliability import test_nan_inf as suite
from tftrt_py.engine.builder import BuilderConfig

pytestmark = ORT


@pytest.fixture(autouse=True)
def engines_on_onnxruntime(monkeypatch):
    monkeypatch.setattr(support, "BuilderConfig", functools.partial(BuilderConfig, backend="onnxruntime"))


@pytest.mark.parametrize("name", sorted(suite.CASES))
def test_fp32_nan_and_inf_as_tensorflow(name):
    suite.check(name, "FP32")


@pytest.mark.parametrize("name", sorted(set(suite.CASES) - suite.FP32_ONLY))
def test_fp16_keeps_nan_and_inf_positions(name):
    suite.check(name, "FP16")
