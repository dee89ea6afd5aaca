"""Calibrators: a histogram of a tensor's absolute values over the calibration data -> its symmetric INT8
range (TensorRT's calibrators).

* ``entropy`` (default, TensorRT's entropy calibrator): of the thresholds from 128 bins up to all 2048, the
  one whose 128-level quantization loses the least information: the reference distribution P is the
  histogram clipped at the threshold with the outliers folded into its last bin; the candidate Q is the
  clipped histogram quantized to 128 levels (each level's count spread evenly over its non-empty bins);
  the smallest KL(P || Q) wins (the largest threshold among equals); thresholds that fold every value
  into one bin are not candidates.
* ``minmax``: the largest absolute value seen.
* ``percentile``: the 99.99th percentile of the absolute values.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Dict

import numpy as np

__all__ = ["Histogram", "Calibrator", "CALIBRATORS", "get_calibrator", "entropy_amax", "minmax_amax",
           "percentile_amax", "NUM_BINS", "NUM_QUANTIZED_BINS", "START_BIN", "PERCENTILE"]

NUM_BINS = 2048
NUM_QUANTIZED_BINS = 128
START_BIN = 128
PERCENTILE = 99.99


class Histogram:
    """Counts of |x| in NUM_BINS equal bins over [0, upper], and the exact max of |x| (only the max where
    `binned` is false: a calibrator that reads nothing else, minmax, skips the counting).

    The range grows to the largest value seen: counts already collected are spread over the wider bins
    by interpolating their cumulative distribution (so batches may arrive in any order).
    """

    def __init__(self, num_bins: int = NUM_BINS, binned: bool = True):
        self.counts = np.zeros(num_bins, np.float64)
        self.binned = binned
        self.upper = 0.0
        self.amax = 0.0

    @property
    def edges(self) -> np.ndarray:
        return np.linspace(0.0, self.upper, len(self.counts) + 1)

    def add(self, values, device=None) -> None:
        """Count the finite values of `values` (calibration runs this for every tensor of every batch): a host
        array, or with `device` (a backend that calibrates on its device) an array of that backend's, counted there
        by the same arithmetic (Backend.finite_abs_max and Backend.bin_counts)."""
        n = len(self.counts)
        if device is not None:
            top = device.finite_abs_max(values)
            self._count(top, lambda scale: device.bin_counts(values, scale, n))
            return
        a = np.asarray(values, np.float32).ravel()
        low, high = (a.min(), a.max()) if a.size else (0.0, 0.0)
        if not (np.isfinite(low) and np.isfinite(high)):  # NaN or inf: only the finite values count
            a = a[np.isfinite(a)]
            low, high = (a.min(), a.max()) if a.size else (0.0, 0.0)
        self._count(float(max(high, -low)) if a.size else -1.0, lambda scale: _bin_counts(a, scale, n))

    def _count(self, top: float, bin_counts: Callable[[np.float32], np.ndarray]) -> None:
        """Take a batch whose largest finite |value| is `top` (-1.0: no finite value), binned at a scale by
        `bin_counts` (values * scale, truncated, clamped to the last bin) once the range holds `top`."""
        if top < 0.0:
            return
        self.amax = max(self.amax, top)
        if not self.binned:
            return
        if top > self.upper:
            self._grow(top)
        n = len(self.counts)
        # only zeros so far (upper 0): they belong to bin 0 whatever the range becomes, where a scale of 0 puts them
        self.counts += bin_counts(np.float32(n / self.upper if self.upper else 0.0))

    def _grow(self, upper: float) -> None:
        if self.upper > 0.0:
            cdf = np.concatenate([[0.0], np.cumsum(self.counts)])
            new_edges = np.linspace(0.0, upper, len(self.counts) + 1)
            self.counts = np.diff(np.interp(new_edges, self.edges, cdf))
        self.upper = upper


CHUNK = 1 << 16  # values binned at a time: the chunk's scratch stays in cache


def _bin_counts(a: np.ndarray, scale: np.float32, n: int) -> np.ndarray:
    """np.bincount(min(|a| * scale, n - 1) as integers, minlength=n), a chunk at a time. Done whole, its three
    temporaries of a tensor's size (|a|, the float bins, the integer bins) cost page faults and memory traffic:
    12.6M values (an FFN tensor of BERT at batch 32) take 73 ms that way, 20 ms in chunks, with the same counts."""
    counts = np.zeros(n, np.int64)
    size = min(a.size, CHUNK)
    scaled, index = np.empty(size, np.float32), np.empty(size, np.intp)
    for start in range(0, a.size, CHUNK):
        chunk = a[start:start + CHUNK]
        s, i = scaled[:chunk.size], index[:chunk.size]
        np.abs(chunk, out=s)
        np.multiply(s, scale, out=s)
        np.minimum(s, np.float32(n - 1), out=s)
        np.copyto(i, s, casting="unsafe")  # truncates: the floor of values >= 0
        counts += np.bincount(i, minlength=n)
    return counts


def _kl_divergence(counts: np.ndarray, outliers: float, levels: int) -> float:
    """KL(P || Q) over the first len(counts) bins: P is them with `outliers` folded into the last bin, Q
    is them merged into `levels` levels, each level's count spread evenly over its non-empty bins."""
    i = len(counts)
    p = counts.copy()
    p[-1] += outliers
    level = (np.arange(i) * levels) // i
    nonzero = counts != 0
    level_sums = np.bincount(level, weights=counts, minlength=levels)
    level_bins = np.bincount(level, weights=nonzero, minlength=levels)
    q = np.where(nonzero, level_sums[level] / np.maximum(level_bins[level], 1), 0.0)
    keep = p != 0
    p, q = p[keep] / p.sum(), q[keep] / q.sum()
    if not q.all():  # P has mass where Q has none (outliers folded into an empty bin)
        return float("inf")
    return float(np.sum(p * np.log(p / q)))


def entropy_amax(hist: Histogram, levels: int = NUM_QUANTIZED_BINS, start: int = START_BIN) -> float:
    """The threshold of least KL divergence (the upper edge of the last bin kept). All thresholds are judged at
    once from prefix sums (_divergences); those within rounding of the least are judged again one by one
    (_kl_divergence), so ties break as the definition says."""
    counts = hist.counts
    if hist.upper == 0.0 or not counts.any():
        return 0.0
    n = len(counts)
    start = min(start, n)
    outliers = np.concatenate([np.cumsum(counts[::-1])[::-1], [0.0]])  # outliers[i] = counts[i:].sum()
    below = np.concatenate([[0.0], np.cumsum(counts)])  # below[i] = counts[:i].sum()
    thresholds = np.arange(start, n + 1)
    divergences = np.full(len(thresholds), np.inf)
    comparable = _comparable(thresholds, counts, below, outliers)
    divergences[comparable] = _divergences(counts, below, outliers, thresholds[comparable], levels)
    least = divergences.min()
    if np.isfinite(least):
        near = np.flatnonzero(divergences <= least + 1e-9 * abs(least) + 1e-10)
        divergences[near] = [_kl_divergence(counts[:i], outliers[i], levels) for i in thresholds[near]]
    best = start + len(divergences) - 1 - int(np.argmin(divergences[::-1]))  # ties: the largest threshold
    return float(hist.edges[best])


def _divergences(counts: np.ndarray, below: np.ndarray, outliers: np.ndarray, thresholds: np.ndarray,
                 levels: int) -> np.ndarray:
    """_kl_divergence(counts[:i], outliers[i], levels) for each threshold i (all at least `levels`), from prefix
    sums: level l of threshold i holds bins [ceil(l i / levels), ceil((l + 1) i / levels)), where Q is the level's
    count spread over its non-empty bins, so each level adds sum c log c - C log(C / nonzero) over its bins; the
    last bin adds the outliers. P sums to the total T and Q to the counts kept, B; KL = sum p log(p / q) / T +
    log(B / T). Agrees with _kl_divergence to rounding (entropy_amax rechecks the least)."""
    total = below[-1]
    nonzero = counts != 0
    clogc = np.where(nonzero, counts * np.log(np.where(nonzero, counts, 1.0)), 0.0)
    prefix = [np.concatenate([[0.0], np.cumsum(v)]) for v in (counts, clogc, nonzero.astype(np.float64))]
    t = thresholds[:, None]
    edges = -((-np.arange(levels + 1)[None, :] * t) // levels)  # ceil(l * i / levels), shape [thresholds, levels + 1]
    c, cl, nz = (np.diff(p[edges], axis=1) for p in prefix)
    with np.errstate(divide="ignore", invalid="ignore"):
        per_level = np.where(c > 0, cl - c * np.log(c / np.maximum(nz, 1.0)), 0.0)
        i = thresholds
        last, out = counts[i - 1], outliers[i]
        q_last = np.where(last > 0, c[:, -1] / np.maximum(nz[:, -1], 1.0), 0.0)  # the last bin's level is the last
        p_last = last + out
        fix = np.where(last > 0, last * np.log(np.where(last > 0, last, 1.0) / q_last), 0.0)
        with_out = np.where(p_last > 0, p_last * np.log(p_last / q_last), 0.0)
        sums = per_level.sum(axis=1) - fix + with_out
        kl = sums / total + np.log(below[i] / total)
    kl[(p_last > 0) & (q_last == 0)] = np.inf
    return kl


def _comparable(i: np.ndarray, counts: np.ndarray, below: np.ndarray, outliers: np.ndarray) -> np.ndarray:
    """Whether clipping at bin i (each of an array of them) gives a distribution KL can judge.

    Not when outliers are folded into an empty last bin (Q has no mass there: infinitely far), nor when
    every kept value sits in the last bin with the outliers (P and Q are one spike, KL = 0: a tensor far
    from 0 would be clipped at its minimum).
    """
    return (outliers[i] == 0) | ((counts[i - 1] != 0) & (below[i - 1] > 0))


def minmax_amax(hist: Histogram) -> float:
    return float(hist.amax)


def percentile_amax(hist: Histogram, percentile: float = PERCENTILE) -> float:
    """The upper edge of the bin where the cumulative count reaches `percentile` % (at most the max)."""
    total = hist.counts.sum()
    if hist.upper == 0.0 or total == 0:
        return 0.0
    cdf = np.cumsum(hist.counts) / total
    idx = min(int(np.searchsorted(cdf, percentile / 100.0)), len(cdf) - 1)
    return float(min(hist.edges[idx + 1], hist.amax))


@dataclasses.dataclass(frozen=True)
class Calibrator:
    """A calibration algorithm: its name, its table header (TensorRT's names), histogram -> range, and whether
    that reads the histogram's counts (or only its max)."""

    name: str
    header: str
    amax: Callable[[Histogram], float]
    binned: bool = True


CALIBRATORS: Dict[str, Calibrator] = {c.name: c for c in (
    Calibrator("entropy", "EntropyCalibration2", entropy_amax),
    Calibrator("minmax", "MinMaxCalibration", minmax_amax, binned=False),
    Calibrator("percentile", "PercentileCalibration", percentile_amax),
)}


def get_calibrator(name: str) -> Calibrator:
    try:
        return CALIBRATORS[str(name).lower()]
    except KeyError:
        raise ValueError(f"unknown calibration algorithm {name!r}; use one of {', '.join(CALIBRATORS)}") from None
