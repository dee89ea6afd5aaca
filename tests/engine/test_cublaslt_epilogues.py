"""Which activations a cuBLASLt GEMM computes in its epilogue (cupy backend; no GPU needed), and why an erf GELU may
take cuBLASLt's tanh form in fp16: the two differ by less than rounding the result to fp16 does."""
import math

import numpy as np
import pytest

from tftrt_py.engine.backends.cupy.cublaslt import fused_epilogue

erf = np.vectorize(math.erf)


def gelu_erf(x):
    return 0.5 * x * (1 + erf(x / math.sqrt(2)))


def gelu_tanh(x):
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_bias_and_the_tanh_gelu_fuse_relu_never(dtype):
    assert fused_epilogue(True, None, dtype) == "BIAS" and fused_epilogue(False, None, dtype) == "DEFAULT"
    assert fused_epilogue(True, {"type": "gelu_tanh"}, dtype) == "GELU_BIAS"
    assert fused_epilogue(True, {"type": "relu"}, dtype) is None  # cuBLASLt's ReLU turns NaN into 0


def test_the_erf_gelu_fuses_as_the_tanh_form_in_fp16_only():
    assert fused_epilogue(True, {"type": "gelu_erf"}, "float32") is None
    assert fused_epilogue(True, {"type": "gelu_erf"}, "float16") == "GELU_BIAS"
    assert fused_epilogue(False, {"type": "gelu_erf"}, "float16") == "GELU"


def test_the_tanh_form_differs_from_erf_by_less_than_fp16_rounding():
    x = np.linspace(-12, 12, 240001)
    exact, approx = gelu_erf(x), gelu_tanh(x)
    worst = int(np.argmax(np.abs(exact - approx)))
    assert abs(exact[worst] - approx[worst]) < 4.8e-4 and abs(x[worst]) == pytest.approx(2.70, abs=0.01)
    x = np.random.default_rng(0).normal(0, 1.5, 200000)
    exact, approx = gelu_erf(x), gelu_tanh(x)
    rounding = np.linalg.norm(exact.astype(np.float16) - exact) / np.linalg.norm(exact)
    assert np.linalg.norm(approx - exact) / np.linalg.norm(exact) < 0.9 * rounding


def test_a_recorded_cublas_tactic_builds_without_asking_for_cublaslt(monkeypatch):
    """Whether cuBLASLt is there is asked last (it imports nvmath-python, most of a second): a recorded cuBLAS
    tactic, or TFTRT_PY_GEMM=cublas, never asks."""
    from tftrt_py.engine.backends.cupy import cublaslt
    from tftrt_py.engine.backends.cupy.ops.matmul import gemm_paths

    asked = []
    monkeypatch.setattr(cublaslt, "available", lambda: asked.append(1) or True)
    assert gemm_paths({"op": "cublas_gemm"}, "cublas_gemm", "cublaslt_gemm") == (True, False)
    monkeypatch.setenv("TFTRT_PY_GEMM", "cublas")
    assert gemm_paths(None, "cublas_gemm", "cublaslt_gemm") == (True, False)
    assert not asked
    monkeypatch.delenv("TFTRT_PY_GEMM")
    assert gemm_paths(None, "cublas_gemm", "cublaslt_gemm") == (True, True) and asked
