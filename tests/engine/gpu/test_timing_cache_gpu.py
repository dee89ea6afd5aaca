"""The timing cache on a GPU: a build with a cache that an earlier build filled (in memory, or saved and loaded as a
new process would) times nothing and chooses the same tactics; the candidates a build times are built ahead, side by
side."""
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


@pytest.mark.parametrize("precision", ["FP32", "FP16", "INT8"])
def test_every_timed_layer_takes_the_candidates_built_ahead_side_by_side(precision, monkeypatch):
    built_in, unused = [], []
    prebuild, release = tactics.Tuner.prebuild, tactics.Tuner.release

    def watched_prebuild(self, jobs):
        prebuild(self, jobs)
        built_in.extend(self._prebuilt)

    def watched_release(self):
        unused.extend(self._prebuilt)
        release(self)

    monkeypatch.setattr(tactics.Tuner, "prebuild", watched_prebuild)
    monkeypatch.setattr(tactics.Tuner, "release", watched_release)
    def network():
        net = conv_relu_pool_net()
        for t in [*net.inputs, *(t for layer in net.layers for t in layer.outputs)] if precision == "INT8" else ():
            t.dynamic_range = 4.0
        return net

    engine = Builder(BuilderConfig(precision, backend="cupy")).build_engine(network())
    assert built_in and unused == [], (built_in, unused)
    x = np.random.default_rng(0).standard_normal((4, 8, 8, 3)).astype(np.float32)
    want = Builder(BuilderConfig(precision, backend="numpy")).build_engine(network()).create_execution_context()
    got, ref = engine.create_execution_context().execute_v2([x])[0], want.execute_v2([x])[0]
    tol = {"FP32": 1e-4, "FP16": 1e-2, "INT8": 5e-2}[precision] * max(1.0, float(np.max(np.abs(ref))))
    np.testing.assert_allclose(got, ref, atol=tol, rtol=0, err_msg="an engine of candidates built ahead")


def test_anticipating_an_int8_build_compiles_its_cudnn_plans_in_other_processes(monkeypatch, tmp_path, caplog):
    """Builder.anticipate (run while calibration runs) has worker processes build the convolutions' cuDNN plans:
    their machine code lands in the driver's JIT cache, and their runtime-compiled plans come back serialized; the
    build that follows loads those instead of compiling them, and computes what the numpy backend does."""
    import collections
    import logging
    import re

    from tftrt_py.engine.backends.cupy import cudnn_warmup
    from tftrt_py.engine.backends.cupy.ops import conv

    monkeypatch.setenv("CUDA_CACHE_PATH", str(tmp_path / "nv"))
    monkeypatch.setattr(conv, "_GRAPHS", collections.OrderedDict())  # none of this process's plans built yet
    caplog.set_level(logging.DEBUG, logger=cudnn_warmup.__name__)

    def network():
        net = conv_relu_pool_net()
        for t in [*net.inputs, *(t for layer in net.layers for t in layer.outputs)]:
            t.dynamic_range = 4.0
        return net

    builder = Builder(BuilderConfig("INT8", backend="cupy"))
    builder.anticipate(network())
    done = [r.getMessage() for r in caplog.records if r.name == cudnn_warmup.__name__]
    assert len(done) == 1 and "built ahead" in done[0] and "failed" not in done[0], done
    assert int(re.search(r"(\d+) runtime-compiled plan\(s\) offered", done[0]).group(1)) > 0, done
    assert any(f.is_file() and f.stat().st_size for f in (tmp_path / "nv").rglob("*")), "nothing in the cache"
    engine = builder.build_engine(network())
    assert any(g.loaded for g in conv._GRAPHS.values()), "no offered plan was loaded"
    x = np.random.default_rng(0).standard_normal((4, 8, 8, 3)).astype(np.float32)
    want = Builder(BuilderConfig("INT8", backend="numpy")).build_engine(network()).create_execution_context()
    got, ref = engine.create_execution_context().execute_v2([x])[0], want.execute_v2([x])[0]
    np.testing.assert_allclose(got, ref, atol=5e-2 * max(1.0, float(np.max(np.abs(ref)))), rtol=0)
