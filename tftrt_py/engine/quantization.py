"""The quantization rules every backend follows: fp16 and E4M3 rounding, the INT8 and FP8 formats, scales.

A tensor's dynamic range ``amax`` maps to the format's largest magnitude: scale = amax / qmax (1 for an empty or
non-finite range); an activation is quantized per tensor, ``round(x / scale)`` (int8: round half to even, clamped
to [-127, 127]; FP8: :func:`round_e4m3`); constant weights per output channel, scale = max|w| / qmax over the other
axes (1 where that is 0).
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Tuple

import numpy as np

__all__ = ["QMAX", "E4M3_MAX", "QuantFormat", "FORMATS", "round_fp16", "round_e4m3", "round_int8", "scale",
           "quantize", "quantize_per_channel"]

#: The largest int8 magnitude used: ranges are symmetric, so -128 is never produced.
QMAX = 127

#: The largest finite E4M3FN value (1.75 * 2**8); E4M3FN has no infinities.
E4M3_MAX = 448.0
#: E4M3: 3 mantissa bits; normal exponents from -6, below that subnormal steps of 2**-9.
_E4M3_MANTISSA_BITS, _E4M3_MIN_EXP = 3, -6


def round_fp16(a: np.ndarray) -> np.ndarray:
    """`a` rounded to the nearest fp16 values (overflow gives inf, as on the GPU), in its own dtype."""
    if a.dtype != np.float32 and a.dtype != np.float64:
        return a
    with np.errstate(over="ignore"):
        return a.astype(np.float16).astype(a.dtype)


def round_e4m3(a: np.ndarray) -> np.ndarray:
    """`a` rounded to the nearest E4M3FN values (ties to even), saturated to +-448 (infinities too), NaN kept;
    in float64, which holds every E4M3 value exactly (the GPU's ``cvt.rn.satfinite.e4m3``)."""
    a = np.asarray(a, np.float64)
    _, exp = np.frexp(a)  # |a| = m * 2**exp with m in [0.5, 1): the binade's exponent is exp - 1
    step = np.ldexp(1.0, np.maximum(exp - 1, _E4M3_MIN_EXP) - _E4M3_MANTISSA_BITS)
    return np.clip(np.rint(a / step) * step, -E4M3_MAX, E4M3_MAX)


def round_int8(a: np.ndarray) -> np.ndarray:
    """`a` rounded half to even and clamped to [-127, 127]."""
    return np.clip(np.rint(a), -QMAX, QMAX)


@dataclasses.dataclass(frozen=True)
class QuantFormat:
    """How a quantized precision rounds: the largest magnitude (a range maps to it), the rounding, and the
    dtype its products are summed in (int8: exactly, in float64; fp8: in fp32, as the GPU accumulates)."""

    qmax: float
    round: Callable[[np.ndarray], np.ndarray]
    sum_dtype: type


#: The format of each quantized precision (types.QUANTIZED).
FORMATS = {"INT8": QuantFormat(QMAX, round_int8, np.float64), "FP8": QuantFormat(E4M3_MAX, round_e4m3, np.float32)}


def scale(amax, qmax: float = QMAX) -> float:
    """The symmetric per-tensor scale of a tensor with dynamic range `amax` (1 for an empty or non-finite range)."""
    amax = float(amax)
    return amax / qmax if amax > 0 and np.isfinite(amax) else 1.0


def quantize(x: np.ndarray, amax: float, fmt: QuantFormat = FORMATS["INT8"]) -> Tuple[np.ndarray, float]:
    """(quantized values of x held in float64, scale) for the symmetric range [-amax, amax]."""
    s = scale(amax, fmt.qmax)
    return fmt.round(np.asarray(x, np.float64) / s), s


def quantize_per_channel(w: np.ndarray, axis: int = -1,
                         fmt: QuantFormat = FORMATS["INT8"]) -> Tuple[np.ndarray, np.ndarray]:
    """(quantized values of w held in float64, scale per index of `axis`): one scale per output channel."""
    w = np.asarray(w, np.float64)
    axis = axis % w.ndim
    amax = np.max(np.abs(w), axis=tuple(i for i in range(w.ndim) if i != axis), keepdims=True)
    s = np.where(amax > 0, amax / fmt.qmax, 1.0)
    return fmt.round(w / s), s
