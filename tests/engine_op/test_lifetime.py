"""A loaded converted model goes when the user drops it: its engine ops, engines and execution contexts with it,
whatever TensorFlow keeps for TF-TRT's op type (see engine_op.lifetime); a converter keeps its own ops while it
lives."""
from __future__ import annotations

import gc
import os
import weakref

import numpy as np
import pytest
import tensorflow as tf

from sample_models import build_mlp
from tftrt_py import trt_convert as trt
from tftrt_py.engine_op import dispatcher

CYCLES = 100


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """A converted MLP whose engine for batch 8 is saved with it; its segment key."""
    tmp = tmp_path_factory.mktemp("lifetime")
    module, signatures = build_mlp(0)
    tf.saved_model.save(module, str(tmp / "native"), signatures=signatures)
    converter = trt.TrtGraphConverterV2(input_saved_model_dir=str(tmp / "native"))
    converter.convert()
    converter.build(lambda: [(tf.zeros((8, 16)) + 0.5,)])
    converter.save(str(tmp / "trt"))
    key = next(n.attr["segment_key"].s.decode() for n in converter._converted_graph_def.node
               if n.op == "TRTEngineOp")
    return str(tmp / "trt"), key


def ops_of(key):
    return [op for (k, _, _), op in dispatcher.engine_ops().items() if k == key]


def load_call_drop(path, key, x):
    """Load, serve once from the saved engine, drop; weak references to the op and its engines."""
    model = tf.saved_model.load(path)
    model.signatures["serving_default"](features=x)
    (op,) = ops_of(key)
    assert op.stats.engine_runs == 1 and op.stats.builds == 0
    refs = [weakref.ref(op)] + [weakref.ref(e) for e in op.engines()]
    del model, op
    gc.collect()
    return refs


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="needs /proc (Linux)")
def test_load_call_drop_cycles_free_every_engine_op_and_keep_memory_flat(converted):
    path, key = converted
    x = tf.constant(np.random.default_rng(0).standard_normal((8, 16)).astype("float32"))
    assert not ops_of(key)
    fifth = None
    for cycle in range(CYCLES):
        refs = load_call_drop(path, key, x)
        assert all(ref() is None for ref in refs), f"cycle {cycle}: the dropped model's engine op or engines live on"
        assert not ops_of(key)
        if cycle == 4:
            fifth = rss_mb()
    last = rss_mb()
    print(f"RSS after cycle 5: {fifth:.1f} MB, after cycle {CYCLES}: {last:.1f} MB")
    assert last <= fifth * 1.05


def test_a_model_in_use_keeps_its_engine_op(converted):
    path, key = converted
    x = tf.constant(np.ones((8, 16), np.float32))
    model = tf.saved_model.load(path)
    serve = model.signatures["serving_default"]
    first = serve(features=x)["logits"].numpy()
    gc.collect()
    (op,) = ops_of(key)
    np.testing.assert_array_equal(serve(features=x)["logits"].numpy(), first)
    assert op.stats.engine_runs == 2 and op.stats.builds == 0


def test_a_converters_engine_ops_live_as_long_as_the_converter(tmp_path):
    module, signatures = build_mlp(1)
    tf.saved_model.save(module, str(tmp_path / "native"), signatures=signatures)
    converter = trt.TrtGraphConverterV2(input_saved_model_dir=str(tmp_path / "native"))
    converter.convert()
    converter.build(lambda: [(tf.zeros((4, 16)) + 0.5,)])
    key = next(n.attr["segment_key"].s.decode() for n in converter._converted_graph_def.node
               if n.op == "TRTEngineOp")
    op = weakref.ref(dispatcher.find(key))
    converter._converted_func = None  # its kernels go; the converter still needs the op (save, summary)
    gc.collect()
    assert dispatcher.find(key) is op() is not None and op().stats.builds == 1
    del converter
    gc.collect()
    assert dispatcher.find(key) is None and op() is None


def test_a_release_that_a_finalizer_runs_inside_create_waits_for_it_instead_of_deadlocking(converted, monkeypatch):
    """The garbage collector runs finalizers at any allocation: one dropping a model while dispatcher.create holds
    the registry (that model's kernels calling release on the same thread) is released once create is done."""
    import threading

    path, _ = converted
    model = tf.saved_model.load(path)
    serve = model.signatures["serving_default"]
    serve(tf.zeros((8, 16)) + 0.5)
    graph = serve.graph.as_graph_def()
    library = {f.signature.name: f for f in graph.library.function}
    node = next(n for f in library.values() for n in f.node_def if n.op == "TRTEngineOp")
    segment = library[node.attr["segment_func"].func.name]
    victim = max(dispatcher._HANDLES)
    released_inside = []

    class FinalizingOps(dict):
        def get(self, key, default=None):  # inside create's locked block
            if not released_inside:
                dispatcher.release(victim)
                released_inside.append(victim in dispatcher._HANDLES)
            return super().get(key, default)

    monkeypatch.setattr(dispatcher, "_OPS", FinalizingOps(dispatcher._OPS))
    handles = []
    worker = threading.Thread(target=lambda: handles.append(
        dispatcher.create(node.SerializeToString(), segment.SerializeToString())), daemon=True)
    worker.start()
    worker.join(60)
    assert not worker.is_alive(), "create deadlocked on a release from inside it"
    assert released_inside == [True] and victim not in dispatcher._HANDLES  # deferred, then done
    dispatcher.release(handles[0])
