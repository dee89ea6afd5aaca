"""Dynamic-shape profile strategies (TF-TRT's names): collected input shapes -> optimization profiles.

Each collected item is the tuple of an engine op's input shapes for one call. Strategies:

- ``Range``: one profile, min and max the per-dim min and max of every collected shape, opt = max.
- ``Optimal``: one profile per distinct collected shape, min = opt = max = that shape.
- ``Range+Optimal``: the Optimal profiles, then the Range one (the tightest profile serves first).
- ``ImplicitBatchModeCompatible``: per collected call, batch 1 (each non-scalar input's first dim) up to
  its shapes, opt = max (what TF 1.x's implicit-batch engines served); profiles inside another one dropped.
"""
from __future__ import annotations

from typing import List, Sequence, Tuple

from tftrt_py.engine.profile import OptimizationProfile

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
    """TF-TRT's: per collected call, min = its shapes with each non-scalar input's first dim set to 1,
    opt = max = its shapes; a profile that another one contains is left out."""
    profiles = [OptimizationProfile(tuple((1,) + s[1:] if s else s for s in shapes), shapes, shapes)
                for shapes in collected]
    return [p for p in profiles if not any(q is not p and q.contains(p.min) and q.contains(p.max)
                                           for q in profiles)]


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
