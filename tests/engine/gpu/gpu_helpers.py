"""GPU test helpers: the ``gpu`` marker with its skip, and building the same network for the numpy
and cupy backends to compare them on fresh random inputs.

Activation and binding buffers are poisoned (NaN bytes) before use, so unwritten outputs fail.
"""
from __future__ import annotations

import os
import sys
from typing import Callable, Dict, Sequence

import numpy as np
import pytest

from tftrt_py.engine import Engine, Network
from tftrt_py.engine.backends.cupy import available

os.environ.setdefault("TFTRT_PY_POISON", "1")

#: Mark a test module ``pytestmark = GPU``: needs cupy and an NVIDIA GPU, skipped otherwise.
GPU = [pytest.mark.gpu, pytest.mark.skipif(not available()[0], reason="needs an NVIDIA GPU with cupy "
                                           "(tftrt_py.engine.backends.cupy.available())")]

TOL = {"FP32": 1e-4, "FP16": 1e-2}


@pytest.fixture(autouse=True)
def healthy_gpu():
    """After each test: a CUDA fault (sticky for the process) ends the process instead of failing every
    later test (under pytest-xdist the worker is replaced)."""
    yield
    import cupy

    try:
        cupy.cuda.runtime.deviceSynchronize()
    except Exception as exc:  # pragma: no cover - only on a GPU fault
        sys.stderr.write(f"\nthe CUDA context is broken ({exc}); ending this test process\n")
        sys.stderr.flush()
        os._exit(3)


def cupy_engine(network: Network, precision: str = "FP32", **build_config) -> Engine:
    for layer in network.layers:
        layer.precision = None if layer.kind == "Constant" else precision
    return Engine(network, precision=precision, backend="cupy", build_config=build_config)


def assert_close(got: np.ndarray, ref: np.ndarray, precision: str, what: str = "") -> None:
    assert got.shape == ref.shape and got.dtype == ref.dtype, (what, got.shape, ref.shape, got.dtype, ref.dtype)
    if ref.dtype.kind in "biu":
        np.testing.assert_array_equal(got, ref, err_msg=what)
        return
    tol = TOL[precision]
    scale = max(1.0, float(np.max(np.abs(ref))) if ref.size else 1.0)
    np.testing.assert_allclose(got.astype(np.float64), ref.astype(np.float64), rtol=tol, atol=tol * scale,
                               err_msg=what)


def assert_close_with_nonfinite(got: np.ndarray, ref: np.ndarray, precision: str, what: str = "") -> None:
    """NaN and Inf exactly where `ref` has them, the finite values as assert_close."""
    np.testing.assert_array_equal(np.isnan(got), np.isnan(ref), err_msg=what)
    np.testing.assert_array_equal(np.isinf(got), np.isinf(ref), err_msg=what)
    finite = np.isfinite(ref)
    assert_close(np.where(finite, got, 0).astype(ref.dtype), np.where(finite, ref, 0), precision, what)


def compare(build: Callable[[], Network], make_inputs: Callable[[np.random.Generator], Dict[str, np.ndarray]],
            precision: str = "FP32", runs: int = 2, seed: int = 0) -> Engine:
    """Numpy (FP32) vs cupy (`precision`) on `runs` fresh input sets (the first run is eager and
    captures the CUDA graph; later runs replay it)."""
    rng = np.random.default_rng(seed)
    ref_ctx = Engine(build(), precision="FP32", backend="numpy").create_execution_context()
    engine = cupy_engine(build(), precision)
    bad = [r for r in getattr(engine.cupy_program, "tuning_report", []) if not r["ok"]]
    assert not bad, f"tactics that disagree with the numpy backend: {bad}"
    ctx = engine.create_execution_context()
    for run in range(runs):
        inputs = make_inputs(rng)
        ref = ref_ctx.execute(inputs)
        got = ctx.execute(inputs)
        for name in ref:
            assert_close(got[name], ref[name], precision, f"{name} (run {run})")
    return engine


def single(kind: str, in_specs: Sequence, params: dict, weights: dict = None) -> Callable[[], Network]:
    """A network of one `kind` layer over inputs [(dtype, shape), ...]; outputs y0, y1, ..."""

    def build() -> Network:
        net = Network(kind.lower())
        ins = [net.add_input(f"x{i}", d, s) for i, (d, s) in enumerate(in_specs)]
        layer = net.add_layer(kind, ins, dict(params), dict(weights or {}), name=kind.lower())
        for i, t in enumerate(layer.outputs):
            net.mark_output(t, name=f"y{i}")
        return net

    return build


def normal(*shapes, dtype="float32", low=None, high=None):
    """make_inputs for inputs x0, x1, ... (uniform in [low, high) when given, else standard normal)."""

    def make(rng):
        out = {}
        for i, s in enumerate(shapes):
            if dtype in ("int32",):
                out[f"x{i}"] = rng.integers(-9, 10, s).astype(dtype)
            elif low is not None:
                out[f"x{i}"] = rng.uniform(low, high, s).astype(dtype)
            else:
                out[f"x{i}"] = rng.standard_normal(s).astype(dtype)
        return out

    return make


def tanh_dense(rows: int, width: int, seed: int = 0) -> Callable[[], Network]:
    """A network factory: y0 = tanh(x0 @ W), x0 float32 [rows, width], W a fixed random [width, width] (so an
    output can be fed back as the next input)."""
    w = (np.random.default_rng(seed).standard_normal((width, width)) / np.sqrt(width)).astype(np.float32)

    def build() -> Network:
        net = Network("fc")
        x = net.add_input("x0", "float32", (rows, width))
        y = net.add_layer("MatrixMultiply", [x, net.add_constant(w)], {"activation": {"type": "tanh"}}).outputs[0]
        net.mark_output(y, name="y0")
        return net

    return build
