"""Dynamic-shape profile strategies (TF-TRT's names): collected input shapes -> optimization profiles.

Each collected item is the tuple of an engine op's input shapes for one call. Strategies:

- ``Range``: one profile, min and max the per-dim min and max of every collected shape, opt = max.
- ``Optimal``: one profile per distinct collected shape, min = opt = max = that shape.
- ``Range+Optimal``: the Optimal profiles, then the Range one (the tightest profile serves first).
- ``ImplicitBatchModeCompatible``: one profile per distinct non-batch shape, batch 1 to the largest
  batch collected with it, opt = max (what TF 1.x's implicit-batch engines served).
"""
from __future__ import annotations

from typing import Dict, List, Sequence, Tuple

from tftrt_py.engine.runtime import OptimizationProfile

__all__ = ["PROFILE_STRATEGY_RANGE", "PROFILE_STRATEGY_OPTIMAL", "PROFILE_STRATEGY_RANGE_OPTIMAL",
           "PROFILE_STRATEGY_IMPLICIT_BATCH_MODE_COMPATIBLE", "supported_profile_strategies",
           "verify_profile_strategy", "make_profiles"]

PROFILE_STRATEGY_RANGE = "Range"
PROFILE_STRATEGY_OPTIMAL = "Optimal"
PROFILE_STRATEGY_RANGE_OPTIMAL = "Range+Optimal"
PROFILE_STRATEGY_IMPLICIT_BATCH_MODE_COMPATIBLE = "ImplicitBatchModeCompatible"

Shapes = Tuple[Tuple[int, ...], ...]


def supported_profile_strategies() -> List[str]:
    return [PROFILE_STRATEGY_RANGE, PROFILE_STRATEGY_OPTIMAL, PROFILE_STRATEGY_RANGE_OPTIMAL,
            PROFILE_STRATEGY_IMPLICIT_BATCH_MODE_COMPATIBLE]


def verify_profile_strategy(strategy: str) -> str:
    """The canonical spelling of `strategy` (matched case-insensitively); TF-TRT's ValueError otherwise."""
    by_lower = {s.lower(): s for s in supported_profile_strategies()}
    if not isinstance(strategy, str) or strategy.lower() not in by_lower:
        raise ValueError(f"profile_strategy '{strategy}' is not supported. It should be one of "
                         f"{supported_profile_strategies()}")
    return by_lower[strategy.lower()]


def _range(collected: Sequence[Shapes]) -> List[OptimizationProfile]:
    if len({tuple(len(s) for s in shapes) for shapes in collected}) != 1:
        raise ValueError("Number of input dimensions differ during profile creation")
    low = tuple(tuple(min(d) for d in zip(*dims)) for dims in zip(*collected))
    high = tuple(tuple(max(d) for d in zip(*dims)) for dims in zip(*collected))
    return [OptimizationProfile(low, high, high)]


def _optimal(collected: Sequence[Shapes]) -> List[OptimizationProfile]:
    return [OptimizationProfile(shapes, shapes, shapes) for shapes in collected]


def _implicit_batch(collected: Sequence[Shapes]) -> List[OptimizationProfile]:
    batches: Dict[Shapes, int] = {}
    for shapes in collected:
        if any(not s for s in shapes) or len({s[0] for s in shapes}) != 1:
            raise ValueError(f"ImplicitBatchModeCompatible needs every input to share its first (batch) "
                             f"dimension; got input shapes {[list(s) for s in shapes]}")
        rest = tuple(s[1:] for s in shapes)
        batches[rest] = max(batches.get(rest, 0), shapes[0][0])
    profiles = []
    for rest, batch in batches.items():
        high = tuple((batch,) + r for r in rest)
        profiles.append(OptimizationProfile(tuple((1,) + r for r in rest), high, high))
    return profiles


_STRATEGIES = {
    PROFILE_STRATEGY_RANGE: _range,
    PROFILE_STRATEGY_OPTIMAL: _optimal,
    PROFILE_STRATEGY_RANGE_OPTIMAL: lambda collected: _optimal(collected) + _range(collected),
    PROFILE_STRATEGY_IMPLICIT_BATCH_MODE_COMPATIBLE: _implicit_batch,
}


def make_profiles(strategy: str, collected: Sequence[Shapes]) -> List[OptimizationProfile]:
    """The profiles `strategy` makes from the collected input shapes (duplicates ignored)."""
    collected = list(dict.fromkeys(tuple(tuple(int(d) for d in s) for s in shapes) for shapes in collected))
    if not collected:
        return []
    profiles = _STRATEGIES[verify_profile_strategy(strategy)](collected)
    return list(dict.fromkeys(profiles))
