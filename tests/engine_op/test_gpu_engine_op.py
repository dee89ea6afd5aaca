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
