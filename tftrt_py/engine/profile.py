"""Optimization profiles: the range of input shapes one engine serves."""
from __future__ import annotations

from typing import Sequence, Tuple

__all__ = ["OptimizationProfile"]


class OptimizationProfile:
    """Per input, the (min, opt, max) shapes an engine serves (TensorRT's optimization profile).

    An input lies inside the profile when, for every input, each dim is between min and max.
    """

    def __init__(self, min_shapes, opt_shapes, max_shapes):
        self.min, self.opt, self.max = (tuple(tuple(int(d) for d in s) for s in shapes)
                                        for shapes in (min_shapes, opt_shapes, max_shapes))
        ranks = {tuple(len(s) for s in shapes) for shapes in (self.min, self.opt, self.max)}
        if len(ranks) != 1 or not all(lo <= o <= hi for shapes in zip(self.min, self.opt, self.max)
                                      for lo, o, hi in zip(*shapes)):
            raise ValueError(f"invalid optimization profile: min {self.min}, opt {self.opt}, max {self.max} "
                             f"(need equal ranks and min <= opt <= max in every dim)")

    def contains(self, shapes: Sequence[Sequence[int]]) -> bool:
        shapes = [tuple(s) for s in shapes]
        return len(shapes) == len(self.min) and all(
            len(s) == len(lo) and all(a <= d <= b for d, a, b in zip(s, lo, hi))
            for s, lo, hi in zip(shapes, self.min, self.max))

    @property
    def key(self) -> Tuple[Tuple[int, ...], ...]:
        """min, opt and max shapes in one tuple (hashable, ordered like cache keys)."""
        return self.min + self.opt + self.max

    def as_dict(self) -> dict:
        return {"min": [list(s) for s in self.min], "opt": [list(s) for s in self.opt],
                "max": [list(s) for s in self.max]}

    @classmethod
    def from_dict(cls, d: dict) -> "OptimizationProfile":
        return cls(d["min"], d["opt"], d["max"])

    def __eq__(self, other):
        return isinstance(other, OptimizationProfile) and self.key == other.key

    def __hash__(self):
        return hash(self.key)

    def __repr__(self):
        return f"OptimizationProfile(min={list(self.min)}, opt={list(self.opt)}, max={list(self.max)})"
