"""Calls of shapes an engine served exactly run its ExecutionContext.call directly (ONNX Runtime engines: the
session's run, without the full path's checks and look-ups): the same outputs, counters, LRU order and native
fallback as the full path; profiling, shape collection and calibration take the full path again."""
from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from sample_models import build_mlp
from tftrt_py import trt_convert as trt
from tftrt_py.engine.backends.onnxruntime import available
from tftrt_py.engine.runtime import ExecutionContext, Profiler
from tftrt_py.engine_op import dispatcher
from tftrt_py.engine_op import op as op_module

pytestmark = pytest.mark.skipif(not available()[0], reason=available()[1])


@pytest.fixture
def served(tmp_path, monkeypatch):
    """(converted signature, native signature, the engine op): the MLP on onnxruntime, engines for batches 2
    and 4 built, two cache slots."""
    monkeypatch.setattr(op_module, "_backend_name", "onnxruntime")
    module, signatures = build_mlp(0)
    tf.saved_model.save(module, str(tmp_path / "native"), signatures=signatures)
    params = trt.DEFAULT_TRT_CONVERSION_PARAMS._replace(maximum_cached_engines=2)
    converter = trt.TrtGraphConverterV2(input_saved_model_dir=str(tmp_path / "native"), conversion_params=params)
    converter.convert()
    converter.build(lambda: [(tf.zeros((b, 16)) + 0.5,) for b in (2, 4)])
    converter.save(str(tmp_path / "trt"))
    del converter
    model = tf.saved_model.load(str(tmp_path / "trt")).signatures["serving_default"]
    native = tf.saved_model.load(str(tmp_path / "native")).signatures["serving_default"]
    feed = features(2, 0)
    before = set(dispatcher.engine_ops())
    model(features=feed)
    (op,) = [op for key, op in dispatcher.engine_ops().items() if key not in before]
    assert op.engines()[0].backend_name == "onnxruntime"
    return model, native, op


def features(batch, seed):
    return tf.constant(np.random.default_rng(seed).standard_normal((batch, 16)).astype("float32"))


def check(model, native, feed):
    np.testing.assert_allclose(model(features=feed)["logits"], native(features=feed)["logits"], rtol=1e-5,
                               atol=1e-5)


def test_repeated_calls_match_tensorflow_and_count_every_run(served):
    model, native, op = served
    runs, hits = op.stats.engine_runs, op.stats.hits
    for seed in range(4):
        check(model, native, features(2, seed))
    assert op.stats.engine_runs == runs + 4 and op.stats.hits == hits + 4 and op.stats.fallbacks == {}


def test_nan_and_inf_inputs_give_what_the_full_path_gives(served):
    model, _, op = served
    x = np.random.default_rng(1).standard_normal((2, 16)).astype("float32")
    x[0, 3], x[1, 5] = np.nan, np.inf
    op.revoke_replays()  # the next call takes the full path
    full = model(features=tf.constant(x))["logits"].numpy()
    direct = model(features=tf.constant(x))["logits"].numpy()
    assert np.isnan(full).any()
    np.testing.assert_array_equal(direct, full)


def test_a_direct_call_failing_runs_the_native_segment(served, monkeypatch):
    model, native, op = served
    op.revoke_replays()  # the next call takes the full path and keeps the call below

    def failing(self):
        def call(inputs, outputs=None):
            raise RuntimeError("session lost")
        return call
    monkeypatch.setattr(ExecutionContext, "call", failing)
    check(model, native, features(2, 1))  # the full path: served by the engine
    assert op.stats.fallbacks == {}
    check(model, native, features(2, 2))
    assert op.stats.fallbacks == {"runtime_failure": 1}
    assert "session lost" in op.native[((2, 16),)]


def test_direct_calls_keep_the_engine_most_recently_used(served):
    model, native, op = served
    assert sorted(op.cache.keys()) == [((2, 16),), ((4, 16),)]
    check(model, native, features(4, 0))
    for _ in range(2):  # the batch-2 engine, served directly, becomes the most recently used
        check(model, native, features(2, 1))
    check(model, native, features(5, 0))  # a new engine evicts the least recently used: batch 4's
    assert sorted(op.cache.keys()) == [((2, 16),), ((5, 16),)]


def test_a_profiler_gets_the_layer_times_of_every_call(served):
    model, native, op = served
    profiler = Profiler()
    op.set_profiler(profiler)
    try:
        check(model, native, features(2, 1))
        counts = {name: len(times) for name, times in profiler.records.items()}
        check(model, native, features(2, 2))
        assert counts and all(len(profiler.records[name]) == n + 1 for name, n in counts.items())
    finally:
        op.set_profiler(None)


def test_collecting_shapes_runs_natively_after_direct_calls(served):
    model, native, op = served
    check(model, native, features(2, 1))
    dispatcher.start_collecting(op.segment_key)
    runs = op.stats.engine_runs
    check(model, native, features(2, 2))
    assert dispatcher.stop_collecting(op.segment_key) == [((2, 16),)]
    assert op.stats.engine_runs == runs
