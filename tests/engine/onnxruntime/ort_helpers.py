"""ONNX Runtime test helpers: the same network built for the numpy backend (the reference) and the
onnxruntime backend, compared on fresh random inputs; outputs are written into NaN-poisoned buffers."""
from __future__ import annotations

from typing import Callable, Dict

import numpy as np
import pytest

from tftrt_py.engine import Engine, Network
from tftrt_py.engine.backends.onnxruntime import available

#: Mark a test module ``pytestmark = ORT``: needs onnxruntime and onnx.
ORT = pytest.mark.skipif(not available()[0], reason=available()[1])

#: Relative (and, past magnitude 1, scaled absolute) tolerance per requested precision: the numpy backend
#: rounds FP16 and INT8 layers' outputs to fp16 as the GPU does, the CPU keeps fp32 (INT8 sums are exact on both).
TOL = {"FP32": 1e-5, "FP16": 1e-2, "INT8": 1e-3}

#: Engines whose lowering is under test: INT8 layers stay INT8 (no choice of the faster precision).
STRICT = {"strict_types": True}


def with_precision(network: Network, precision: str) -> Network:
    for layer in network.layers:
        layer.precision = None if layer.kind == "Constant" else precision
    return network


def poisoned(index, shape, engine):
    dtype = engine.get_binding_dtype(len(engine.inputs) + index)
    out = np.empty(shape, dtype)
    out.reshape(-1).view(np.uint8).fill(255)  # NaN for floats, -1 for ints: unwritten outputs show up
    return out


def assert_close(got: np.ndarray, ref: np.ndarray, precision: str, what: str = "") -> None:
    assert got.shape == ref.shape and got.dtype == ref.dtype, (what, got.shape, ref.shape, got.dtype, ref.dtype)
    if ref.dtype.kind in "biu":
        np.testing.assert_array_equal(got, ref, err_msg=what)
        return
    tol = TOL["FP16" if ref.dtype == np.float16 else precision]  # (numpy computes float16 tensors in fp16)
    scale = max(1.0, float(np.max(np.abs(ref))) if ref.size else 1.0)
    np.testing.assert_allclose(got.astype(np.float64), ref.astype(np.float64), rtol=tol, atol=tol * scale,
                               err_msg=what)


def compare(build: Callable[[], Network], make_inputs: Callable[[np.random.Generator], Dict[str, np.ndarray]],
            precision: str = "FP32", runs: int = 2, seed: int = 0) -> Engine:
    """The numpy backend vs onnxruntime, both with `precision` set on every layer, on `runs` fresh input sets."""
    rng = np.random.default_rng(seed)
    ref_ctx = Engine(with_precision(build(), precision), precision, backend="numpy").create_execution_context()
    engine = Engine(with_precision(build(), precision), precision, backend="onnxruntime", build_config=STRICT)
    ctx = engine.create_execution_context()
    for run in range(runs):
        inputs = make_inputs(rng)
        ref = ref_ctx.execute(inputs)
        got = ctx.execute(inputs, outputs=lambda i, shape: poisoned(i, shape, engine))
        for name in ref:
            assert_close(got[name], ref[name], precision, f"{name} (run {run})")
    return engine
