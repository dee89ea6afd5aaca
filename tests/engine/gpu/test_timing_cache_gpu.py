"""The timing cache on a GPU: a build with a cache that an earlier build filled (in memory, or saved and loaded as a
new process would) times nothing and chooses the same tactics."""
import numpy as np
import pytest

from tftrt_py.engine import Builder, BuilderConfig
from tftrt_py.engine.backends.cupy import tactics
from tftrt_py.engine.timing_cache import TimingCache

from networks import conv_relu_pool_net
from gpu_helpers import GPU, assert_close, healthy_gpu  # noqa: F401 (autouse fixture)

pytestmark = GPU


@pytest.mark.parametrize("precision", ["FP32", "FP16"])
def test_a_warm_cache_times_nothing_and_chooses_the_same_tactics(precision, monkeypatch, tmp_path):
    timed = []
    rounds = tactics.Tuner._rounds

    def counting(self, timers):
        timed.append([op.tactic for op, _ in timers])
        return rounds(self, timers)

    monkeypatch.setattr(tactics.Tuner, "_rounds", counting)
    cache = TimingCache()
    first = Builder(BuilderConfig(precision, backend="cupy", timing_cache=cache)).build_engine(conv_relu_pool_net())
    assert timed and len(cache) >= 1, (timed, first.tactics)

    timed.clear()
    second = Builder(BuilderConfig(precision, backend="cupy", timing_cache=cache)).build_engine(conv_relu_pool_net())
    assert timed == [] and second.tactics == first.tactics

    cache.save(str(tmp_path / "cache.json"))
    loaded = TimingCache.load(str(tmp_path / "cache.json"))
    third = Builder(BuilderConfig(precision, backend="cupy", timing_cache=loaded)).build_engine(conv_relu_pool_net())
    assert timed == [] and third.tactics == first.tactics and not loaded.unsaved

    x = np.random.default_rng(0).standard_normal((4, 8, 8, 3)).astype(np.float32)
    outs = [e.create_execution_context().execute_v2([x])[0] for e in (first, third)]
    assert_close(outs[1], outs[0], precision, "the warm-built engine")
