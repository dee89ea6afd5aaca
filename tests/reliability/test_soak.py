"""A converted model served 2,000 times keeps its memory: resident set growth after warm-up stays under
20 MB (read from /proc/self/statm), and its answers stay native TensorFlow's. Batches of up to 256 rows move
~36 kB in and out per call, so keeping each call's buffers would pass the bound (~70 MB)."""
import gc
import os

import numpy as np
import pytest
import tensorflow as tf

from sample_models import build_mlp
from tftrt_py import trt_convert as trt
from tftrt_py.engine_op import dispatcher

WARM_UP, CALLS, GROWTH_BOUND_MB = 200, 2000, 20


def rss_mb() -> float:
    """This process's resident set size in MB."""
    gc.collect()
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def engine_runs(ops) -> int:
    return sum(op.stats.engine_runs for op in ops)


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="needs /proc (Linux)")
def test_2000_calls_keep_memory_flat(tmp_path):
    module, signatures = build_mlp(0)
    tf.saved_model.save(module, str(tmp_path / "native"), signatures=signatures)
    converter = trt.TrtGraphConverterV2(input_saved_model_dir=str(tmp_path / "native"))
    converter.convert()
    converter.build(lambda: [(tf.zeros((256, 16)) + 0.5,)])  # one engine serves every batch (padded)
    converter.save(str(tmp_path / "trt"))
    native, model = [tf.saved_model.load(str(tmp_path / d)).signatures["serving_default"] for d in ("native", "trt")]
    rng = np.random.default_rng(0)
    inputs = [tf.constant(rng.standard_normal((b, 16)).astype("float32")) for b in (1, 64, 200, 256)]
    expected = [native(features=x)["logits"].numpy() for x in inputs]
    known = set(dispatcher.engine_ops())  # the loaded model's engine op comes with its first call

    def serve(calls):
        for i in range(calls):
            model(features=inputs[i % 4])

    serve(WARM_UP)
    before = rss_mb()
    serve(CALLS)
    growth = rss_mb() - before
    print(f"{CALLS} calls after {WARM_UP} warm-up calls: RSS {before:.1f} MB -> {before + growth:.1f} MB "
          f"(growth {growth:+.2f} MB)")
    assert growth < GROWTH_BOUND_MB
    for x, want in zip(inputs, expected):
        np.testing.assert_allclose(model(features=x)["logits"].numpy(), want, rtol=1e-5, atol=1e-5)
    served = [op for key, op in dispatcher.engine_ops().items() if key not in known]
    assert engine_runs(served) == WARM_UP + CALLS + len(inputs)  # engines served every call
