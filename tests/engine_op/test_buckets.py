"""Row-wise engines serve a small batch at about its own size: a copy of the engine built for the batch's bucket
(the next power of two) serves it (on the CPU the first such call waits for the copy; on a GPU the engine serves
it padded until the copy is ready); batches near the engine's run on the engine, padded. The copies take no
engine-cache slot."""
from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from networks import conv_relu_pool_net
from sample_models import build_mlp
from tftrt_py import trt_convert as trt
from tftrt_py.engine import Builder, BuilderConfig, Network
from tftrt_py.engine_op import dispatcher
from tftrt_py.engine_op.buckets import BatchBuckets, bucket_for, serving_pool
from tftrt_py.engine_op.pool import ContextPool


@pytest.mark.parametrize("batch, engine_batch, bucket", [
    (1, 512, 1), (2, 512, 2), (3, 512, 4), (200, 512, 256), (256, 512, 256), (257, 512, 512), (512, 512, 512),
    (1, 8, 1), (4, 8, 4), (5, 8, 8), (3, 4, 4), (1, 2, 1), (2, 3, 3)])
def test_bucket_is_the_next_power_of_two_unless_the_engine_is_within_twice_the_batch(batch, engine_batch, bucket):
    assert bucket_for(batch, engine_batch) == bucket


def engine(batch, backend="numpy"):
    return Builder(BuilderConfig(backend=backend)).build_engine(conv_relu_pool_net(batch))


def test_on_the_cpu_a_small_batch_waits_for_its_copy():
    buckets = serving_pool(engine(64))
    assert isinstance(buckets, BatchBuckets)
    x = np.random.default_rng(0).standard_normal((64, 8, 8, 3)).astype("float32")
    full = buckets.execute_v2([x])[0]
    copy = buckets.context_for([(3, 8, 8, 3)])
    assert copy.engine.max_batch_size == 4 and buckets.copies == 1 and not buckets.pending([(3, 8, 8, 3)])
    assert copy.engine.binding == getattr(buckets.engine, "binding", None)
    np.testing.assert_allclose(buckets.execute_v2([x[:3]])[0], full[:3], rtol=1e-6, atol=1e-6)
    assert buckets.context_for([(40, 8, 8, 3)]).engine.max_batch_size == 64  # within twice: no copy
    assert buckets.copies == 1


def test_on_a_gpu_a_small_batch_runs_padded_until_its_copy_is_built():
    big = engine(64)
    big.device = "NVIDIA H100 80GB HBM3"  # builds tune kernels there: calls do not wait for them
    buckets = serving_pool(big)
    first = buckets.context_for([(1, 8, 8, 3)])
    assert first.engine is big
    buckets.wait()
    assert buckets.context_for([(1, 8, 8, 3)]).engine.max_batch_size == 1


def test_copies_are_built_by_the_engines_backend_and_match_it():
    buckets = serving_pool(engine(16, backend="onnxruntime"))
    x = np.random.default_rng(1).standard_normal((16, 8, 8, 3)).astype("float32")
    full = buckets.execute_v2([x])[0]
    buckets.context_for([(1, 8, 8, 3)])
    buckets.wait()
    copy = buckets.context_for([(1, 8, 8, 3)])
    assert copy.engine.backend_name == "onnxruntime" and copy.engine.max_batch_size == 1
    np.testing.assert_allclose(buckets.execute_v2([x[:1]])[0], full[:1], rtol=1e-5, atol=1e-5)


def test_engines_mixing_rows_or_of_one_row_get_a_single_pool():
    net = Network()
    x = net.add_input("x", "float32", (4, 3))
    net.mark_output(net.add_layer("Reduce", [x], {"op": "sum", "axes": [0], "keep_dims": True}).outputs[0])
    assert isinstance(serving_pool(Builder().build_engine(net)), ContextPool)
    assert isinstance(serving_pool(engine(1)), ContextPool)


def test_a_served_model_keeps_one_engine_and_runs_small_batches_on_a_copy(tmp_path):
    module, signatures = build_mlp(0)
    tf.saved_model.save(module, str(tmp_path / "native"), signatures=signatures)
    converter = trt.TrtGraphConverterV2(input_saved_model_dir=str(tmp_path / "native"))  # one cache slot
    converter.convert()
    converter.build(lambda: [(tf.zeros((8, 16)) + 0.5,)])
    converter.save(str(tmp_path / "trt"))
    native = tf.saved_model.load(str(tmp_path / "native")).signatures["serving_default"]
    model = tf.saved_model.load(str(tmp_path / "trt")).signatures["serving_default"]
    rng = np.random.default_rng(2)
    big, small = (tf.constant(rng.standard_normal((b, 16)).astype("float32")) for b in (512, 1))
    np.testing.assert_allclose(model(features=big)["logits"], native(features=big)["logits"], rtol=1e-5, atol=1e-5)
    key = next(k for k, op in dispatcher.engine_ops().items() if op.stats.engine_runs and op.cache.keys() ==
               [((512, 16),)])
    op = dispatcher.engine_ops()[key]
    op._contexts[((512, 16),)]._wait = False  # copies build in the background, as on a GPU
    for _ in range(2):  # the first is served by the batch-512 engine while the copy builds
        np.testing.assert_allclose(model(features=small)["logits"], native(features=small)["logits"], rtol=1e-5,
                                   atol=1e-5)
        dispatcher.wait_for_builds()  # what a server's warm-up waits for
        assert op.batch_copies == 1
    assert len(op.cache) == 1 and op.batch_copies == 1 and op.stats.builds == 1  # the 512 engine replaced batch 8's
    assert op._contexts[((512, 16),)].context_for([(1, 16)]).engine.max_batch_size == 1
