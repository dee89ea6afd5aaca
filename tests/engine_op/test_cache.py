"""The engine cache: LRU by input shapes, smallest suitable engine, failures take no slot; cache files."""
import pytest

from tftrt_py.engine import PlanError
from tftrt_py.engine_op.cache import EngineCache, pack_plans, unpack_plans


class FakeEngine:
    """Serves its batch or smaller, with equal other dims (a row-wise engine)."""

    def __init__(self, shape):
        self.shape = shape

    def can_serve(self, shapes):
        (s,) = shapes
        return s[1:] == self.shape[1:] and s[0] <= self.shape[0]


def key(batch):
    return ((batch, 4),)


def test_exact_match_then_smallest_suitable_engine():
    cache = EngineCache(3)
    for b in (8, 2, 4):
        cache.insert(key(b), FakeEngine((b, 4)))
    assert cache.lookup(key(4)) == key(4)
    assert cache.lookup(key(3)) == key(4)  # 4 is the smallest engine that serves batch 3
    assert cache.lookup(key(9)) is None


def test_full_cache_evicts_the_least_recently_used():
    cache = EngineCache(2)
    cache.insert(key(1), FakeEngine((1, 4)))
    cache.insert(key(2), FakeEngine((2, 4)))
    cache.lookup(key(1))  # 2 is now the least recently used
    assert cache.insert(key(4), FakeEngine((4, 4))) == key(2)
    assert cache.keys() == [key(1), key(4)]


def test_failed_builds_are_remembered_without_a_slot():
    cache = EngineCache(1)
    cache.failed[key(2)] = "boom"
    assert len(cache) == 0 and cache.insert(key(1), FakeEngine((1, 4))) is None


def test_cache_file_round_trip_and_damage():
    plans = [b"plan-a", b"", b"plan-c" * 100]
    data = pack_plans(plans)
    assert unpack_plans(data) == plans
    with pytest.raises(PlanError, match="truncated"):
        unpack_plans(data[:-5])
    with pytest.raises(PlanError, match="not a tftrt_py engine cache"):
        unpack_plans(b"GARBAGE!" + data[8:])
