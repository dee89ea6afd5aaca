"""Eight threads serve one converted model at once, with batch sizes whose engines do not fit in its cache
(maximum_cached_engines=2, and each batch size needs its own engine): engines are evicted and rebuilt while
other threads run, and every answer equals native TensorFlow's."""
import threading

import numpy as np
import tensorflow as tf

from tftrt_py import trt_convert as trt
from tftrt_py.engine_op import dispatcher

THREADS, CALLS, BATCHES = 8, 200, range(1, 7)


class BatchCentred(tf.Module):
    """Convolution, ReLU, spatial mean and a dense layer; outputs centred over the batch, so an engine serves
    only its own batch size (a smaller batch padded to it would shift the mean)."""

    def __init__(self):
        rng = np.random.default_rng(0)
        self.filters = tf.constant(rng.normal(0, 0.5, (3, 3, 3, 8)).astype("float32"))
        self.dense = tf.constant(rng.normal(0, 0.5, (8, 4)).astype("float32"))

    @tf.function(input_signature=[tf.TensorSpec([None, 8, 8, 3], tf.float32, name="image")])
    def serve(self, image):
        h = tf.nn.relu(tf.nn.conv2d(image, self.filters, 1, "SAME"))
        y = tf.matmul(tf.reduce_mean(h, axis=[1, 2]), self.dense)
        return {"y": y - tf.reduce_mean(y, axis=0)}


def converted(tmp_path):
    """(native signature, converted signature) of BatchCentred, converted with 2 cached engines per op."""
    module = BatchCentred()
    tf.saved_model.save(module, str(tmp_path / "native"), signatures={"serving_default": module.serve})
    params = trt.DEFAULT_TRT_CONVERSION_PARAMS._replace(maximum_cached_engines=2)
    converter = trt.TrtGraphConverterV2(input_saved_model_dir=str(tmp_path / "native"), conversion_params=params)
    converter.convert()
    converter.save(str(tmp_path / "trt"))
    return [tf.saved_model.load(str(tmp_path / d)).signatures["serving_default"] for d in ("native", "trt")]


def totals():
    """Builds, evictions and native fallbacks summed over the engine ops alive."""
    ops = dispatcher.engine_ops().values()
    return np.array([sum(op.stats.builds for op in ops), sum(op.stats.evictions for op in ops),
                     sum(sum(op.stats.fallbacks.values()) for op in ops)])


def test_threads_share_an_evicting_cache_and_get_native_answers(tmp_path):
    native, model = converted(tmp_path)
    rng = np.random.default_rng(13)
    inputs = [rng.standard_normal((b, 8, 8, 3)).astype("float32") for b in rng.choice(BATCHES, CALLS)]
    expected = [native(image=x)["y"].numpy() for x in inputs]
    before = totals()
    start, mismatches, errors = threading.Barrier(THREADS), [], []

    def serve(k):
        start.wait()
        for i in range(k, CALLS, THREADS):
            try:
                got = model(image=inputs[i])["y"].numpy()
            except Exception as e:  # noqa: BLE001 - reported below
                errors.append((i, e))
                continue
            if got.shape != expected[i].shape or not np.allclose(got, expected[i], rtol=1e-5, atol=1e-5):
                mismatches.append(i)

    threads = [threading.Thread(target=serve, args=(k,)) for k in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and mismatches == []
    builds, evictions, fallbacks = totals() - before
    print(f"{CALLS} calls on {THREADS} threads: 0 mismatches, {builds} engine builds, {evictions} evictions")
    assert builds > len(BATCHES) and evictions > 0 and fallbacks == 0  # every answer came from an engine
