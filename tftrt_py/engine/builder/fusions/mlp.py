"""MLP fusion: chained 2-d matrix multiplies (with their fused bias and activation) as one MLP layer.

Layer i of an MLP computes ``x = activation_i(x @ w_i + b_i)``; weights are w0, b0, w1, b1, ...
and ``params["activations"]`` lists each layer's activation (or None). Biases and activations
after the last matrix multiply fuse through the affine and activation passes; a residual the last
matrix multiply holds (fusions/gemm.py) stays the MLP's second input. Products joined by a tensor with a dynamic
range stay apart (chained_matmuls).
"""
from __future__ import annotations

import logging
from typing import List, Optional, Tuple

import numpy as np

from tftrt_py.engine.builder.fusions.match import (FLOATS, Fused, apply_rules, constant_value, gemm_residual,
                                                  sole_producer)

__all__ = ["fuse_mlp", "MAX_LAYERS", "MAX_WEIGHT_ELEMENTS"]

logger = logging.getLogger(__name__)

#: at most this many matrix multiplies in one MLP (as TensorRT)
MAX_LAYERS = 31
#: per matrix multiply, the product of the widths (the weight's size) must stay below this
MAX_WEIGHT_ELEMENTS = 1 << 22


def _units(layer) -> Optional[List[Tuple[np.ndarray, np.ndarray, Optional[dict]]]]:
    """(w, b, activation) of each matrix multiply `layer` does, if it can be part of an MLP (its residual
    input, if any, aside)."""
    if layer.kind == "MLP":
        acts = layer.params["activations"]
        return [(layer.weights[f"w{i}"], layer.weights[f"b{i}"], a) for i, a in enumerate(acts)]
    a, b = layer.inputs[:2]
    w = constant_value(b)
    if (a.rank != 2 or w is None or w.ndim != 2 or layer.params.get("transpose_a") or a.dtype not in FLOATS
            or w.size > MAX_WEIGHT_ELEMENTS):
        return None
    w = w.T if layer.params.get("transpose_b") else w
    bias = layer.weights.get("bias", np.zeros(w.shape[1], w.dtype))
    return [(w, bias, layer.params.get("activation"))] if bias.shape == (w.shape[1],) else None


def chained_matmuls(network, users, layer):
    """x -> MatrixMultiply | MLP -> MatrixMultiply | MLP (constant 2-d B) -> y   =>   x -> MLP -> y

    The second may hold a residual (it stays the MLP's); the first may not (it would be added mid-chain). A
    tensor between them with a dynamic range (calibrated, or given by quantization ops) stays a tensor, so INT8 and
    FP8 engines may run both products quantized, the first writing it quantized for the second."""
    if layer.inputs[0].dynamic_range is not None:
        return None
    first = sole_producer(network, users, layer.inputs[0], ("MatrixMultiply", "MLP"))
    units = first and not gemm_residual(first) and _units(first)
    second = units and _units(layer)
    if not second or len(units) + len(second) > MAX_LAYERS:
        return None
    units += second
    weights = {}
    for i, (w, b, _) in enumerate(units):
        weights[f"w{i}"], weights[f"b{i}"] = w, b
    residual = gemm_residual(layer)
    return Fused("MLP", [first, layer], "MLP", first.inputs[:1] + ([residual] if residual else []),
                 {"activations": [a for _, _, a in units]}, weights)


def fuse_mlp(network) -> bool:
    """Merge chains of 2-d matrix multiplies with constant weights into MLP layers."""
    return apply_rules(network, {"MatrixMultiply": [chained_matmuls], "MLP": [chained_matmuls]}, logger)
