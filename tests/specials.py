"""NaN and ±Inf test inputs and the comparison that holds special values to their exact positions (no TF here:
the GPU tests use it too)."""
from __future__ import annotations

from typing import Optional

import numpy as np


def poisoned(shape, seed, only_inf=False):
    """Random values (magnitudes in [0.1, 2]) with ~10% each of NaN, +Inf and -Inf sprinkled in (-Inf for NaN when
    `only_inf`); along the last axis an all-NaN row, a row of alternating -Inf/+Inf (Inf - Inf) and an all-+Inf row
    (from 4 rows on); rank 4: an all-NaN and an all--Inf 2x2 spatial window in the last batch row."""
    rng = np.random.default_rng(seed)
    x = rng.uniform(0.1, 2.0, shape) * rng.choice([-1.0, 1.0], shape)
    pick = rng.random(shape)
    nan = -np.inf if only_inf else np.nan
    x[pick < 0.1], x[(pick >= 0.1) & (pick < 0.2)], x[(pick >= 0.2) & (pick < 0.3)] = nan, np.inf, -np.inf
    rows = x.reshape(-1, shape[-1])
    if rows.shape[0] >= 4:
        rows[0], rows[2] = nan, np.inf
        rows[1] = np.where(np.arange(shape[-1]) % 2, np.inf, -np.inf)
    if len(shape) == 4 and shape[1] >= 4 and shape[2] >= 4:
        x[-1, :2, :2], x[-1, 2:4, 2:4] = nan, -np.inf
    return x.astype(np.float32)


def huge(shape, seed, mixed=False):
    """Random values (magnitudes in [0.1, 2]) with ~30% of them +-3e38 (finite, but their sums, squares and
    products overflow), of one sign per index of the first axis: a sum along any other axis overflows to the same
    Inf in any order. Along the last axis (from 3 rows on) the first and last rows are all 3e38 of their sign and
    the second holds one. `mixed`: both signs anywhere, an all-3e38, an all--3e38 and a row alternating -3e38 and
    +3e38 (for layers whose result depends on no order of summation: softmax, max, comparisons)."""
    rng = np.random.default_rng(seed)
    x = rng.uniform(0.1, 2.0, shape) * rng.choice([-1.0, 1.0], shape)
    sign = rng.choice([-1.0, 1.0], shape) if mixed else np.broadcast_to(
        np.where(np.arange(shape[0]) % 2, -1.0, 1.0).reshape((-1,) + (1,) * (len(shape) - 1)), shape)
    x = np.where(rng.random(shape) < 0.3, sign * 3e38, x)
    rows, row_sign = x.reshape(-1, shape[-1]), sign.reshape(-1, shape[-1])[:, 0]
    if rows.shape[0] >= 3 and mixed:
        rows[0], rows[1], rows[2] = 3e38, -3e38, np.where(np.arange(shape[-1]) % 2, 3e38, -3e38)
    elif rows.shape[0] >= 3:
        rows[0], rows[-1], rows[1, 0] = row_sign[0] * 3e38, row_sign[-1] * 3e38, row_sign[1] * 3e38
    return x.astype(np.float32)


def finite(shape, seed):
    """Random values without NaN or Inf (magnitudes in [0.1, 2])."""
    rng = np.random.default_rng(seed)
    return (rng.uniform(0.1, 2.0, shape) * rng.choice([-1.0, 1.0], shape)).astype(np.float32)


def mismatch(got, want, tol: Optional[float], overflow_ok=False) -> Optional[str]:
    """Why `got` does not match `want`, or None: the same shape and dtype, integers equal, NaN and ±Inf at the same
    positions, finite values within `tol` (relative and absolute; None: not compared). `overflow_ok` (fp16): ±Inf
    only required where `want` has it, and allowed where `want` lies beyond fp16's range."""
    got, want = np.asarray(got), np.asarray(want)
    if got.shape != want.shape or got.dtype != want.dtype:
        return f"shape/dtype {got.shape} {got.dtype} != {want.shape} {want.dtype}"
    if want.dtype.kind != "f":
        bad = np.flatnonzero(got != want)
        return f"{bad.size} values differ, at {bad[:5]}: {got.flat[bad[:5]]} != {want.flat[bad[:5]]}" if bad.size \
            else None
    for what, mask in (("NaN", np.isnan), ("+Inf", np.isposinf), ("-Inf", np.isneginf)):
        expected, found = mask(want), mask(got)
        if overflow_ok and what != "NaN":
            bad = np.flatnonzero(expected & ~found | found & np.isfinite(want) & (np.abs(want) < 6e4))
        else:
            bad = np.flatnonzero(expected != found)
        if bad.size:
            return f"{what} positions differ at {bad[:6]}: got {got.flat[bad[:6]]}, want {want.flat[bad[:6]]}"
    both = np.isfinite(want) & np.isfinite(got)
    if tol is not None:
        bad = np.flatnonzero(both & ~np.isclose(got, want, rtol=tol, atol=tol))
        if bad.size:
            return f"finite values differ at {bad[:6]}: got {got.flat[bad[:6]]}, want {want.flat[bad[:6]]}"
    return None
