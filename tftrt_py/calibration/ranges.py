"""Dynamic ranges on engine tensors: from quantization ops in the graph, and from a calibration table.

A range is symmetric (TensorRT supports only those): [min, max] gives max(|min|, |max|). Ranges the graph
gives win over calibrated ones (user guide 2.9.2: custom ranges for some tensors, calibration for the rest).
"""
from __future__ import annotations

import logging
import math
from typing import Mapping

from tftrt_py.engine.network import Network, Tensor

__all__ = ["symmetric_range", "set_range", "apply_ranges"]

logger = logging.getLogger(__name__)


def symmetric_range(lo: float, hi: float) -> float:
    """The symmetric dynamic range covering [lo, hi]."""
    amax = max(abs(float(lo)), abs(float(hi)))
    if not math.isfinite(amax):
        raise ValueError(f"quantization range [{lo}, {hi}] is not finite")
    return amax


def set_range(tensor: Tensor, lo: float, hi: float) -> None:
    """Give `tensor` the range [lo, hi]; a second range on the same tensor widens it."""
    amax = symmetric_range(lo, hi)
    tensor.dynamic_range = amax if tensor.dynamic_range is None else max(tensor.dynamic_range, amax)


def apply_ranges(network: Network, ranges: Mapping[str, float]) -> int:
    """Give each tensor of `network` named in `ranges` that range, unless it has one; how many got one."""
    applied = 0
    for t in network.inputs + [t for layer in network.layers for t in layer.outputs]:
        if t.dynamic_range is None and t.name in ranges:
            t.dynamic_range = float(ranges[t.name])
            applied += 1
    logger.debug("%s: %d dynamic range(s) from the calibration table", network.name, applied)
    return applied
