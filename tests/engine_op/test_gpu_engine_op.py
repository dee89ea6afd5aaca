"""On a machine with an NVIDIA GPU, converted models run their engines with the cupy backend."""
import numpy as np
import pytest
import tensorflow as tf

from support import random_array
from threads import run_threads
from tftrt_py import trt_convert as trt
from tftrt_py.engine.backends.cupy import available
from tftrt_py.engine_op import dispatcher
from tftrt_py.engine_op import op as engine_op

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not available()[0], reason="needs an NVIDIA GPU with cupy")]


@pytest.fixture(autouse=True)
def cupy_engines(monkeypatch):
    """Engine ops build for the GPU here (tests/conftest.py pins the suite to the numpy reference)."""
    monkeypatch.setenv(engine_op.BACKEND_ENV, "cupy")
    monkeypatch.setattr(engine_op, "_backend_name", None)


@pytest.mark.parametrize("precision, tol", [("FP32", 1e-4), ("FP16", 1e-2)])
def test_saved_and_loaded_model_serves_from_gpu_engines(saved_model, tmp_path, precision, tol):
    model_dir = saved_model("small_cnn")
    converter = trt.TrtGraphConverterV2(input_saved_model_dir=model_dir, precision_mode=precision)
    converter.convert()
    converter.build(input_fn=lambda: iter([random_array((8, 32, 32, 3))]))
    converter.save(str(tmp_path / "converted"))
    loaded = tf.saved_model.load(str(tmp_path / "converted")).signatures["serving_default"]
    native = tf.saved_model.load(model_dir).signatures["serving_default"]

    def check(batch):
        x = tf.constant(random_array((batch, 32, 32, 3)))
        np.testing.assert_allclose(loaded(image=x)["output_0"].numpy(), native(image=x)["output_0"].numpy(),
                                   rtol=tol, atol=tol)
    for batch in (8, 5, 8, 5, 8, 5):  # the built engine and a smaller batch it serves; then native replays
        check(batch)
    run_threads(lambda batch: [check(batch) for _ in range(6)], (8, 8, 8, 5))  # concurrent callers
    [key] = [n.attr["segment_key"].s.decode() for n in converter._converted_graph_def.node if n.op == "TRTEngineOp"]
    op = dispatcher.find(key)
    assert [e.backend_name for e in op.engines()] == ["cupy"]
    assert op.stats.fallbacks == {} and op.stats.engine_runs >= 2
    assert op.stats.native_runs >= 4  # later calls ran without Python (engine.replay)


class LargeDense(tf.Module):
    """Two 4 MiB kernels: kept as variables, read natively and fed to the engine op as weight inputs."""

    def __init__(self):
        rng = np.random.default_rng(3)
        self.w = [tf.Variable(rng.normal(0, 0.03, (1024, 1024)).astype(np.float32)) for _ in range(2)]

    @tf.function(input_signature=[tf.TensorSpec([None, 1024], tf.float32)])
    def serve(self, x):
        return {"y": tf.matmul(tf.nn.relu(tf.matmul(x, self.w[0])), self.w[1])}


def test_native_replays_skip_the_weight_inputs_of_large_variables(tmp_path, monkeypatch):
    monkeypatch.setenv("TFTRT_PY_KEEP_VARIABLES_BYTES", "0")  # 8 MiB of weights: keep them anyway
    model = LargeDense()
    source = str(tmp_path / "dense")
    tf.saved_model.save(model, source, signatures=model.serve)
    converter = trt.TrtGraphConverterV2(input_saved_model_dir=source, precision_mode="FP16")
    converter.convert()
    [node] = [n for n in converter._converted_graph_def.node if n.op == "TRTEngineOp"]
    assert len(node.attr["_tftrt_weight_inputs"].list.i) == 2
    converter.build(input_fn=lambda: iter([random_array((8, 1024))]))
    converter.save(str(tmp_path / "converted"))
    loaded = tf.saved_model.load(str(tmp_path / "converted"))
    serve = loaded.signatures["serving_default"]
    before = set(dispatcher.engine_ops())
    for batch in (8, 5, 8, 5, 8, 5, 8, 8):
        x = random_array((batch, 1024))
        np.testing.assert_allclose(serve(x=tf.constant(x))["y"].numpy(), model.serve(tf.constant(x))["y"].numpy(),
                                   rtol=2e-2, atol=2e-2)
    (op,) = [op for key, op in dispatcher.engine_ops().items() if key not in before]
    assert op.stats.fallbacks == {} and op.stats.builds == 0
    assert op.stats.native_runs >= 4  # replays of the engine's one binding, the weights skipped
