"""The lowerings of layer kinds to ONNX, one function per kind, and the kinds that run on numpy instead.

A lowering is ``fn(g, layer, ins) -> [output names]``: it adds to :class:`~.graph.Graph` `g` the nodes that
compute `layer` from value names `ins` (float16 tensors arrive widened to float32) and returns its outputs in
their compute dtypes (:func:`~.graph.compute_dtype` of the output tensors' dtypes).
"""
from __future__ import annotations

from typing import Callable, Dict

import numpy as np

__all__ = ["LOWERINGS", "NUMPY_KINDS", "lowers", "weight"]

LOWERINGS: Dict[str, Callable] = {}

#: Kinds without an ONNX composition of their exact semantics: the engine runs them with the numpy kernel
#: between ONNX Runtime sub-graphs (kind -> why).
NUMPY_KINDS: Dict[str, str] = {
    "NMS": "TF's CombinedNonMaxSuppression (per-class greedy selection merged by score, clipped, zero-padded) has "
           "no ONNX equivalent: ONNX NonMaxSuppression shares boxes across classes and returns unmerged indices",
}


def lowers(kind: str):
    """Register the lowering of layer kind `kind`."""
    def wrap(fn):
        if kind in LOWERINGS:
            raise ValueError(f"layer kind {kind!r} lowered twice")
        LOWERINGS[kind] = fn
        return fn

    return wrap


def weight(layer, key: str) -> np.ndarray:
    """Weight `key` of `layer` for an fp32 computation (FP16 layers store fp16 weights)."""
    w = layer.weights[key]
    return w.astype(np.float32) if w.dtype == np.float16 else w
