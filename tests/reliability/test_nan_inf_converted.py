"""A converted Keras CNN answers what the native SavedModel answers on images holding NaN and ±Inf pixels, its
engines on the CPU backends (onnxruntime: the default without a GPU; numpy: the reference), with a static and a
dynamic input shape.

The models pool first (TF's CPU MaxPool skips NaN, so one NaN pixel leaves the probabilities finite), then
Conv2D+ReLU, pooling, a Dense layer and a softmax; an Inf pixel becomes ±Inf logits and NaN probabilities. The
reference is the native SavedModel served as a graph (grappler's rewrites, oneDNN's kernels where on); where
oneDNN's softmax differs from TF's default kernel (NaN only where a logit is NaN), the default kernel's softmax of
TF's own logits is accepted too.
"""
import keras
import numpy as np
import pytest
import tensorflow as tf

from specials import mismatch
from tftrt_py import trt_convert as trt
from tftrt_py.engine.backends import onnxruntime as ort_backend
from tftrt_py.engine_op import op as engine_op

BACKENDS = ["numpy", pytest.param("onnxruntime", marks=pytest.mark.skipif(
    not ort_backend.available()[0], reason=ort_backend.available()[1]))]


def small_cnn(dynamic: bool) -> keras.Model:
    keras.utils.set_random_seed(7)
    L = keras.layers
    image = keras.Input((None, None, 3) if dynamic else (16, 16, 3), name="image")
    x = L.MaxPooling2D()(image)
    x = L.Conv2D(8, 3, padding="same", activation="relu")(x)
    x = L.MaxPooling2D()(x)
    x = L.GlobalMaxPooling2D()(x) if dynamic else L.Flatten()(x)
    logits = L.Dense(10, name="logits")(x)
    return keras.Model(image, {"logits": logits, "probs": L.Softmax(name="probs")(logits)})


@pytest.fixture(scope="module", params=[False, True], ids=["static", "dynamic"])
def saved(request, tmp_path_factory):
    """(dynamic, SavedModel directory) of the small CNN."""
    path = str(tmp_path_factory.mktemp("cnn") / "model")
    small_cnn(request.param).export(path, verbose=False)
    return request.param, path


def images(shape, seed=3):
    """A clean image, one NaN pixel, NaN in every channel of two pixels, one +Inf and one -Inf pixel. (No all-NaN
    pooling window: the float32 lowest it gives overflows the sums after it, whose order differs between kernels.)"""
    rng = np.random.default_rng(seed)
    x = rng.uniform(-1.0, 1.0, (5, *shape)).astype(np.float32)
    x[1, 5, 7, 1] = np.nan
    x[2, 4, 6, :] = x[2, 11, 1, :] = np.nan
    x[3, 9, 2, 0] = np.inf
    x[4, 3, 3, 2] = -np.inf
    return x


def plain_softmax(logits):
    with np.errstate(invalid="ignore", over="ignore"):
        e = np.exp(logits - logits.max(-1, keepdims=True))
        return e / e.sum(-1, keepdims=True)


@pytest.mark.parametrize("backend", BACKENDS)
def test_converted_cnn_answers_nan_and_inf_images_as_tensorflow(saved, backend, monkeypatch):
    dynamic, path = saved
    monkeypatch.setenv(engine_op.BACKEND_ENV, backend)
    monkeypatch.setattr(engine_op, "_backend_name", None)
    native = tf.saved_model.load(path).signatures["serving_default"]
    converter = trt.TrtGraphConverterV2(input_saved_model_dir=path)
    served = converter.convert()
    engine_ops = [n.name for n in converter._converted_graph_def.node if n.op == "TRTEngineOp"]
    assert engine_ops
    for shape in [(16, 16, 3), (12, 20, 3)] if dynamic else [(16, 16, 3)]:
        x = tf.constant(images(shape))
        want = {k: v.numpy() for k, v in native(image=x).items()}
        got = {k: v.numpy() for k, v in served(image=x).items()}
        assert np.isfinite(want["probs"][:3]).all() and np.isnan(want["probs"][3]).any()  # the cases are these
        assert mismatch(got["logits"], want["logits"], 1e-4) is None, mismatch(got["logits"], want["logits"], 1e-4)
        why = mismatch(got["probs"], want["probs"], 1e-4)
        assert why is None or mismatch(got["probs"], plain_softmax(want["logits"]), 1e-4) is None, why
    stats = trt.engine_op_stats()
    assert all(stats[name]["fallback_total"] == 0 and stats[name]["engine_runs"] for name in engine_ops), stats
