"""The onnxruntime backend as a whole: plans re-targeted to it, its programs (sessions, numpy layers between
them), its build hooks, the default backend, and a converted Keras model served through it."""
import logging

import numpy as np
import pytest

from networks import conv_relu_pool_net
from ort_helpers import ORT, assert_close, poisoned
from tftrt_py.engine import Builder, BuilderConfig, Network, Runtime
from tftrt_py.engine.backends import default_backend_name, get_backend
from tftrt_py.engine.backends import onnxruntime as ort_backend
from tftrt_py.engine.backends.cupy import available as cupy_available
from tftrt_py.engine.backends.onnxruntime import backend as ort_module
from tftrt_py.engine.backends.onnxruntime.lowering import lower
from tftrt_py.engine.errors import BackendError

pytestmark = ORT


@pytest.mark.parametrize("precision", ["FP32", "FP16"])
def test_plan_built_for_numpy_runs_on_onnxruntime(precision):
    numpy_engine = Builder(BuilderConfig(precision=precision)).build_engine(conv_relu_pool_net())
    engine = Runtime(backend="onnxruntime").deserialize_cuda_engine(numpy_engine.serialize())
    assert engine.backend_name == "onnxruntime"
    ref_ctx, ctx = numpy_engine.create_execution_context(), engine.create_execution_context()
    rng = np.random.default_rng(0)
    for _ in range(2):
        x = {"TensorRTInputPH_0": rng.standard_normal((4, 8, 8, 3)).astype(np.float32)}
        want = ref_ctx.execute(x)["TensorRTOutputPH_0"]
        got = ctx.execute(x, outputs=lambda i, shape: poisoned(i, shape, engine))["TensorRTOutputPH_0"]
        assert_close(got, want, precision)


def test_smaller_batch_of_a_rowwise_engine():
    engine = Builder(BuilderConfig(backend="onnxruntime")).build_engine(conv_relu_pool_net(batch=4))
    ref = Builder().build_engine(conv_relu_pool_net(batch=4)).create_execution_context()
    x = {"TensorRTInputPH_0": np.random.default_rng(1).standard_normal((3, 8, 8, 3)).astype(np.float32)}
    got = engine.create_execution_context().execute(x)["TensorRTOutputPH_0"]
    assert got.shape == (3, 5)
    assert_close(got, ref.execute(x)["TensorRTOutputPH_0"], "FP32")


def _detector() -> Network:
    """conv scores -> NMS (a numpy layer) -> the scores scaled: sessions on both sides of it."""
    rng = np.random.default_rng(2)
    net = Network("detector")
    boxes = net.add_input("boxes", "float32", (2, 12, 1, 4))
    feats = net.add_input("feats", "float32", (2, 12, 6))
    logits = net.add_layer("MatrixMultiply", [feats, net.add_constant(rng.standard_normal((6, 3)).astype("float32"))],
                           {"activation": {"type": "sigmoid"}}).outputs[0]
    nms = net.add_layer("NMS", [boxes, logits], {"max_output_size_per_class": 4, "max_total_size": 6,
                                                 "iou_threshold": 0.5, "score_threshold": 0.2})
    scaled = net.add_layer("Scale", [nms.outputs[1]], {}, {"scale": np.array([2.0], np.float32)}).outputs[0]
    net.mark_output(nms.outputs[0], name="boxes_out")
    net.mark_output(scaled, name="scores_out")
    net.mark_output(logits, name="logits")
    return net


def test_kinds_without_lowering_run_on_numpy_between_sessions(caplog):
    with caplog.at_level(logging.WARNING, logger=ort_module.__name__):
        engine = Builder(BuilderConfig(backend="onnxruntime")).build_engine(_detector())
    kinds = [type(s).__name__ for s in engine.ort_program.steps]
    assert kinds == ["_Session", "LayerStep", "_Session"]
    rng = np.random.default_rng(3)
    lo = rng.uniform(0, 0.6, (2, 12, 1, 2)).astype(np.float32)
    inputs = {"boxes": np.concatenate([lo, lo + rng.uniform(0.1, 0.4, lo.shape).astype(np.float32)], -1),
              "feats": rng.standard_normal((2, 12, 6)).astype(np.float32)}
    want = Builder().build_engine(_detector()).create_execution_context().execute(inputs)
    got = engine.create_execution_context().execute(inputs)
    for name in want:
        assert_close(got[name], want[name], "FP32", name)
    Builder(BuilderConfig(backend="onnxruntime")).build_engine(_detector())
    said = [r for r in caplog.records if "NMS layers run on numpy" in r.getMessage()]
    assert len(said) <= 1  # once per process


def test_lower_gives_a_checked_onnx_model_and_refuses_kinds_without_lowering():
    import onnx

    model = lower(conv_relu_pool_net())
    onnx.checker.check_model(model, full_check=True)
    assert [i.name for i in model.graph.input] == ["TensorRTInputPH_0"]
    assert [o.name for o in model.graph.output] == ["TensorRTOutputPH_0"]
    with pytest.raises(BackendError, match="kind 'NMS' has no ONNX lowering"):
        lower(_detector())


def test_large_constants_stay_out_of_the_model_proto_and_the_session_takes_the_arrays():
    """A network's weights reach ONNX Runtime once (add_external_initializers), not through the proto's bytes."""
    from tftrt_py.engine.backends.onnxruntime.graph import EXTERNAL_BYTES

    rng = np.random.default_rng(5)
    net = Network("wide_conv")
    x = net.add_input("TensorRTInputPH_0", "float32", (2, 8, 8, 3))
    kernel = rng.standard_normal((3, 3, 3, 64)).astype("float32")  # 6.9 kB: external
    assert kernel.nbytes >= EXTERNAL_BYTES
    conv = net.add_layer("Convolution", [x], dict(strides=[1, 1], dilations=[1, 1], pre_padding=[1, 1],
                                                  post_padding=[1, 1], groups=1, activation={"type": "relu"}),
                         {"kernel": kernel, "bias": rng.standard_normal(64).astype("float32")}, name="conv")
    net.mark_output(conv.outputs[0], name="TensorRTOutputPH_0")
    external = {}
    model = lower(net, external=external)
    assert model.ByteSize() < kernel.nbytes and len(external) == 1
    (proto,) = [w for w in model.graph.initializer if w.name in external]
    assert proto.data_location == proto.EXTERNAL and not proto.raw_data
    backend = get_backend("onnxruntime")
    feed = {"TensorRTInputPH_0": rng.standard_normal((2, 8, 8, 3)).astype(np.float32)}
    (got,) = backend.session(model, external).run(None, feed)
    (want,) = backend.session(lower(net)).run(None, feed)
    np.testing.assert_array_equal(got, want)


def test_sessions_take_the_backends_thread_count(monkeypatch):
    backend = get_backend("onnxruntime")
    monkeypatch.setenv("TFTRT_PY_CPU_THREADS", "3")
    assert backend.threads() == 3  # the process's setting (tests/engine/test_threads.py has the order)
    monkeypatch.setattr(type(backend), "threads", lambda self: 1)
    engine = Builder(BuilderConfig(backend="onnxruntime")).build_engine(conv_relu_pool_net())
    (session,) = engine.ort_program.steps
    assert session.session.get_session_options().intra_op_num_threads == 1


def test_fp16_is_said_once(caplog, monkeypatch):
    from tftrt_py.engine.backends.onnxruntime import lowering

    monkeypatch.setattr(lowering, "_said", set())
    with caplog.at_level(logging.WARNING, logger=lowering.__name__):
        Builder(BuilderConfig(precision="FP16", backend="onnxruntime")).build_engine(conv_relu_pool_net())
        Builder(BuilderConfig(precision="FP16", backend="onnxruntime")).build_engine(conv_relu_pool_net())
    assert [r.getMessage() for r in caplog.records].count(
        "FP16 requested: ONNX Runtime's CPU kernels compute FP16 layers in fp32 on their weights rounded to fp16 "
        "(activations are not rounded; the numpy backend rounds them as the GPU does), so outputs differ from FP32 "
        "by fp16-sized amounts (1e-4 to 1e-3 relative), not fp32's") == 1


def test_default_backend_without_a_gpu_is_onnxruntime():
    if cupy_available()[0]:
        assert default_backend_name() == "cupy"
    else:
        assert default_backend_name() == "onnxruntime"


def test_unavailable_onnxruntime_is_refused_clearly(monkeypatch):
    monkeypatch.setattr(ort_module, "available", lambda: (False, ort_backend.UNAVAILABLE))
    with pytest.raises(BackendError, match="onnxruntime / onnx not installed"):
        ort_module.OnnxRuntimeBackend()


def test_converted_keras_model_served_on_onnxruntime(saved_model, monkeypatch):
    import tensorflow as tf

    from support import random_array
    from tftrt_py import trt_convert as trt
    from tftrt_py.engine_op import op as engine_op

    monkeypatch.setenv(engine_op.BACKEND_ENV, "onnxruntime")
    monkeypatch.setattr(engine_op, "_backend_name", None)
    runs = []
    execute = ort_module.Runner.execute
    monkeypatch.setattr(ort_module.Runner, "execute", lambda self, *a, **k: runs.append(1) or execute(self, *a, **k))
    native = tf.saved_model.load(saved_model("small_cnn")).signatures["serving_default"]
    converter = trt.TrtGraphConverterV2(input_saved_model_dir=saved_model("small_cnn"))
    func = converter.convert()
    for batch in (1, 4):
        x = tf.constant(random_array((batch, 32, 32, 3)))
        np.testing.assert_allclose(func(image=x)["output_0"].numpy(), native(image=x)["output_0"].numpy(),
                                   rtol=1e-4, atol=1e-4)
    assert len(runs) == 2
    (name,) = [n.name for n in converter._converted_graph_def.node if n.op == "TRTEngineOp"]
    assert trt.engine_op_stats()[name]["fallback_total"] == 0


def test_sessions_sleep_when_idle_and_skip_slow_fusions():
    session = get_backend("onnxruntime").session(lower(conv_relu_pool_net()))
    options = session.get_session_options()
    assert options.get_session_config_entry("session.intra_op.allow_spinning") == "0"
    disabled = options.get_session_config_entry("optimization.disable_specified_optimizers").split(";")
    assert {"SkipLayerNormFusion", "WeightBiasQuantization", "QDQSelectorActionTransformer"} <= set(disabled)


def test_a_profiler_gets_the_time_of_every_layer_and_the_same_outputs():
    """A Profiler on a context: the engine's layers run in sessions of one layer each (ONNX Runtime times sessions,
    not nodes), each reporting its wall time under the layer's name."""
    from tftrt_py.engine import Profiler

    engine = Builder(BuilderConfig(backend="onnxruntime")).build_engine(conv_relu_pool_net(batch=4))
    ctx = engine.create_execution_context()
    x = {"TensorRTInputPH_0": np.random.default_rng(2).standard_normal((4, 8, 8, 3)).astype(np.float32)}
    want = ctx.execute(x)["TensorRTOutputPH_0"]
    ctx.profiler = profiler = Profiler()
    for _ in range(2):
        np.testing.assert_allclose(ctx.execute(x)["TensorRTOutputPH_0"], want, rtol=1e-6, atol=1e-6)
    layers = [layer.name for layer in engine.network.layers]
    assert sorted(profiler.records) == sorted(layers)
    assert all(len(times) == 2 and min(times) > 0 for times in profiler.records.values())


@pytest.mark.parametrize("network", [conv_relu_pool_net, _detector])
def test_a_call_runs_the_engine_as_execute_v2_does(network):
    """ExecutionContext.call: one session run directly (conv_relu_pool_net) or the whole program (_detector: numpy
    steps between sessions), into the caller's buffers or arrays of its own."""
    engine = Builder(BuilderConfig(backend="onnxruntime")).build_engine(network())
    ctx = engine.create_execution_context()
    call = ctx.call()
    rng = np.random.default_rng(4)
    for _ in range(2):
        inputs = [rng.uniform(0, 0.5, t.shape).astype(t.dtype) for t in engine.inputs]
        want = ctx.execute_v2(inputs)
        into = call(inputs, lambda i, shape: poisoned(i, shape, engine))
        mine = call(inputs)
        for got, again, ref in zip(into, mine, want):
            np.testing.assert_array_equal(got, ref)
            np.testing.assert_array_equal(again, ref)


def _session_threads(program) -> int:
    return program.steps[0].session.get_session_options().intra_op_num_threads


def _timed_by_threads(monkeypatch, many_ms, one_ms, threads=2):
    """Programs time as given by their sessions' intra-op threads, with `threads` allowed; returns the thread counts
    of the programs timed, in order."""
    timed = []

    def run_ms(program, feed):
        timed.append(_session_threads(program))
        return one_ms if timed[-1] == 1 else many_ms

    monkeypatch.setattr(ort_module, "_run_ms", run_ms)
    monkeypatch.setattr(ort_module.OnnxRuntimeBackend, "threads", lambda self: threads)
    return timed


@pytest.mark.parametrize("one_ms, kept", [(0.5, 1), (0.95, 2)])
def test_a_short_engine_runs_on_one_thread_where_that_is_clearly_faster(monkeypatch, one_ms, kept):
    timed = _timed_by_threads(monkeypatch, 1.0, one_ms)
    engine = Builder(BuilderConfig(backend="onnxruntime")).build_engine(conv_relu_pool_net())
    ctx = engine.create_execution_context()
    assert timed == [2, 1] and _session_threads(engine.ort_program) == kept
    x = {"TensorRTInputPH_0": np.random.default_rng(2).standard_normal((2, 8, 8, 3)).astype(np.float32)}
    want = Builder().build_engine(conv_relu_pool_net()).create_execution_context().execute(x)
    assert_close(ctx.execute(x)["TensorRTOutputPH_0"], want["TensorRTOutputPH_0"], "FP32")


def test_an_engine_running_longer_than_the_trial_bound_keeps_its_threads_untried(monkeypatch):
    timed = _timed_by_threads(monkeypatch, ort_module.ONE_THREAD_TRIAL_MS, 0.1)
    engine = Builder(BuilderConfig(backend="onnxruntime")).build_engine(conv_relu_pool_net())
    engine.create_execution_context()
    assert timed == [2] and _session_threads(engine.ort_program) == 2


def test_with_one_thread_allowed_nothing_is_timed(monkeypatch):
    timed = _timed_by_threads(monkeypatch, 1.0, 0.1, threads=1)
    engine = Builder(BuilderConfig(backend="onnxruntime")).build_engine(conv_relu_pool_net())
    engine.create_execution_context()
    assert timed == [] and _session_threads(engine.ort_program) == 1
