"""Freezing keeps large variables as variables: the weights are held once, by the variables, and the converted
SavedModel saves them in its checkpoint (or, below TFTRT_PY_KEEP_VARIABLES_BYTES, as constants); the engines take
their values as weights, not as bindings."""
import os

import numpy as np
import pytest
import tensorflow as tf

from support import saved_module
from tftrt_py import settings, trt_convert as trt
from tftrt_py.convert import variables
from tftrt_py.engine_op import dispatcher

RNG = np.random.default_rng(2112)
WIDTH, HIDDEN, VOCAB = 64, 4096, 4096  # the dense kernel and the embedding are 1 MiB each: kept / gathered


class LargeModel(tf.Module):
    """A 1 MiB Dense kernel (read only: kept), a small bias (frozen) and a 1 MiB embedding table gathered by
    ResourceGather (frozen: a gather of a constant converts, a gather of a variable would stay native)."""

    def __init__(self):
        self.kernel = tf.Variable(RNG.normal(0, 0.1, (WIDTH, HIDDEN)).astype(np.float32))
        self.bias = tf.Variable(RNG.normal(0, 0.1, (HIDDEN,)).astype(np.float32))
        self.embedding = tf.Variable(RNG.normal(0, 0.1, (VOCAB, WIDTH)).astype(np.float32))

    @tf.function(input_signature=[tf.TensorSpec([None, WIDTH], tf.float32), tf.TensorSpec([None], tf.int32)])
    def serve(self, x, ids):
        h = x + tf.nn.embedding_lookup(self.embedding, ids)
        return {"y": tf.nn.relu(tf.matmul(h, self.kernel) + self.bias)}


@pytest.fixture(autouse=True)
def keep_any_size(monkeypatch):
    """This model's variables are small: save them as variables whatever they total (by default from 512 MiB)."""
    monkeypatch.setenv(settings.KEEP_VARIABLES.name, "0")


def feeds(batch):
    return {"x": tf.constant(RNG.normal(0, 1, (batch, WIDTH)).astype(np.float32)),
            "ids": tf.constant(RNG.integers(0, VOCAB, batch).astype(np.int32))}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    model = LargeModel()
    return saved_module(model, model.serve, tmp_path_factory, "large")


@pytest.fixture(params=[False, True], ids=["static", "dynamic"])
def converted(request, model_dir, tmp_path):
    """(converter, saved directory) after convert, build at batch 4, save."""
    converter = trt.TrtGraphConverterV2(input_saved_model_dir=model_dir, use_dynamic_shape=request.param)
    converter.convert()
    converter.build(input_fn=lambda: iter([feeds(4)]))
    out = str(tmp_path / "converted")
    converter.save(out)
    return converter, out


def test_only_the_large_variable_that_is_only_read_stays_a_variable(converted):
    converter, _ = converted
    assert converter.freeze
    graph = converter._converted_graph_def
    assert [n.op for n in converter._engine_nodes()] == ["TRTEngineOp"]
    (node,) = converter._engine_nodes()
    reads = [n for n in graph.node if n.op == "ReadVariableOp"]
    assert len(reads) == 1 and [node.input[i] for i in variables.weight_inputs(node)] == [f"{reads[0].name}:0"]
    assert "ResourceGather" not in {n.op for n in graph.node}  # the embedding was frozen and converts
    # the converted graph and its functions carry the frozen embedding's bytes, not the kernel's
    assert graph.ByteSize() < VOCAB * WIDTH * 4 + WIDTH * HIDDEN * 4 // 4


def test_the_engines_share_the_variables_memory_and_bind_only_the_other_inputs(converted):
    converter, _ = converted
    (node,) = converter._engine_nodes()
    op = dispatcher.find(node.attr["segment_key"].s.decode())
    (kept,) = converter._variables
    (index,) = variables.weight_inputs(node)
    assert np.shares_memory(op.segment_graph().weights[index], np.asarray(kept.value()))
    for engine in op.engines():
        assert len(engine.inputs) == len(variables.engine_inputs(node)) == 2


def test_the_saved_model_keeps_the_large_variable_and_serves_as_the_original_at_any_batch(converted, model_dir):
    _, out = converted
    saved = [name for name, _ in tf.train.list_variables(os.path.join(out, "variables", "variables"))
             if name.endswith("VARIABLE_VALUE")]
    assert len(saved) == 1
    loaded, original = tf.saved_model.load(out), tf.saved_model.load(model_dir)
    serve, want = loaded.signatures["serving_default"], original.signatures["serving_default"]
    for batch in (4, 3, 1):  # built, and two built at serving time from the values the op binds on its first run
        inputs = feeds(batch)
        np.testing.assert_allclose(serve(**inputs)["y"].numpy(), want(**inputs)["y"].numpy(), rtol=1e-5, atol=1e-5)
    inputs = feeds(3)
    x = inputs["x"].numpy()
    x[0, 0], x[1, 1] = np.nan, np.inf
    inputs["x"] = tf.constant(x)
    got, expected = serve(**inputs)["y"].numpy(), want(**inputs)["y"].numpy()
    # NaN propagates as through TF's default kernels (oneDNN's fused MatMul+BiasAdd+Relu gives 0: docs/backends.md)
    assert np.isnan(got[0]).all()
    np.testing.assert_allclose(got[1:], expected[1:], rtol=1e-5, atol=1e-5)  # the Inf row: Inf or 0 as TF's
    served = [s for s in dispatcher.stats().values() if s["engine_runs"]]
    assert served and all(s["fallback_total"] == 0 for s in served)


def test_the_user_guides_freeze_step_serves_the_saved_engines(converted, model_dir):
    """Loading, then convert_variables_to_constants_v2 as the TF-TRT user guide does: the kept variable's read
    becomes a constant feeding the engine op, which serves with the engine saved (no build)."""
    from tensorflow.python.framework import convert_to_constants

    _, out = converted
    loaded, original = tf.saved_model.load(out), tf.saved_model.load(model_dir)
    frozen = convert_to_constants.convert_variables_to_constants_v2(loaded.signatures["serving_default"])
    before = set(dispatcher.engine_ops())
    inputs = feeds(4)
    (got,) = frozen(*[inputs[name] for name in sorted(inputs)])  # as the guide calls it: sorted input names
    np.testing.assert_allclose(got.numpy(), original.signatures["serving_default"](**inputs)["y"].numpy(),
                               rtol=1e-5, atol=1e-5)
    (op,) = [op for key, op in dispatcher.engine_ops().items() if key not in before]
    stats = op.stats.as_dict()
    assert (stats["engine_runs"], stats["builds"], stats["fallback_total"]) == (1, 0, 0)


def test_a_loaded_op_copies_the_weights_only_when_it_builds_an_engine(model_dir, tmp_path):
    """Served from its saved engine, a loaded op holds no copy of the variable; an input no engine serves builds
    one from the segment, with the values that run passed."""
    converter = trt.TrtGraphConverterV2(input_saved_model_dir=model_dir)
    converter.convert()
    converter.build(input_fn=lambda: iter([feeds(4)]))
    out = str(tmp_path / "converted")
    converter.save(out)
    (node,) = converter._engine_nodes()
    del converter
    loaded, original = tf.saved_model.load(out), tf.saved_model.load(model_dir)
    serve, want = loaded.signatures["serving_default"], original.signatures["serving_default"]
    before = set(dispatcher.engine_ops())
    serve(**feeds(4))
    (op,) = [op for key, op in dispatcher.engine_ops().items() if key not in before]
    assert op.segment_graph().weights == {} and op.stats.builds == 0
    inputs = feeds(6)
    np.testing.assert_allclose(serve(**inputs)["y"].numpy(), want(**inputs)["y"].numpy(), rtol=1e-5, atol=1e-5)
    assert op.stats.builds == 1 and set(op.segment_graph().weights) == set(variables.weight_inputs(node))


def test_engines_keep_the_values_of_conversion_time(model_dir, tmp_path):
    """As frozen constants would: assigning the variable after convert() changes no engine."""
    converter = trt.TrtGraphConverterV2(input_saved_model_dir=model_dir)
    converter.convert()
    (kept,) = converter._variables
    inputs = feeds(2)
    before = converter._converted_func(**inputs)["y"].numpy()
    kept.assign(tf.zeros_like(kept))
    np.testing.assert_array_equal(converter._converted_func(**inputs)["y"].numpy(), before)


def test_variables_totalling_less_than_the_setting_are_saved_as_constants_and_serve_as_the_original(
        model_dir, tmp_path, monkeypatch):
    """The conversion keeps them (the weights held once); the SavedModel holds each value as a constant of the native
    segment of the engine op that reads it, which takes no input for it: no variable, no read and no weight input,
    each of which costs the served call."""
    monkeypatch.setenv(settings.KEEP_VARIABLES.name, str(3 << 20))  # the kept-able kernel holds 1 MiB
    converter = trt.TrtGraphConverterV2(input_saved_model_dir=model_dir)
    converter.convert()
    assert len(converter._variables) == 1
    converter.build(input_fn=lambda: iter([feeds(4)]))
    out = str(tmp_path / "converted")
    converter.save(out)
    assert not [name for name, _ in tf.train.list_variables(os.path.join(out, "variables", "variables"))
                if name.endswith("VARIABLE_VALUE")]
    serve = tf.saved_model.load(out).signatures["serving_default"]
    graph = serve.graph.as_graph_def()
    ops = [n.op for n in graph.node] + [n.op for f in graph.library.function for n in f.node_def]
    assert "ReadVariableOp" not in ops and "VarHandleOp" not in ops
    assert not [f for f in graph.library.function if variables.WEIGHTS_FUNCTION in f.signature.name]
    functions = {f.signature.name: f for f in graph.library.function}
    (engine,) = [n for f in graph.library.function for n in f.node_def if n.op == "TRTEngineOp"]
    assert variables.WEIGHT_INPUTS_ATTR not in engine.attr and len(engine.attr["InT"].list.type) == 2
    segment = functions[engine.attr["segment_func"].func.name]
    assert len(segment.signature.input_arg) == 2
    assert WIDTH * HIDDEN * 4 in [len(n.attr["value"].tensor.tensor_content) for n in segment.node_def
                                  if n.op == "Const"]
    want = tf.saved_model.load(model_dir).signatures["serving_default"]
    for batch in (4, 3):  # built, and built at serving time from the values the op binds on its first run
        inputs = feeds(batch)
        np.testing.assert_allclose(serve(**inputs)["y"].numpy(), want(**inputs)["y"].numpy(), rtol=1e-5, atol=1e-5)
    served = [s for s in dispatcher.stats().values() if s["engine_runs"]]
    assert served and all(s["fallback_total"] == 0 for s in served)


def test_the_reads_read_the_captured_handles_directly(converted):
    """No Identity of a handle is left between a read and its variable (each node costs the served call)."""
    converter, _ = converted
    graph = converter._converted_graph_def
    nodes = {n.name: n for n in graph.node}
    (read,) = [n for n in graph.node if n.op == "ReadVariableOp"]
    assert nodes[read.input[0].split(":")[0]].op == "Placeholder"
    assert not [n for n in graph.node if n.op == "Identity" and n.attr["T"].type == tf.resource.as_datatype_enum]


def test_small_variables_are_frozen_as_before(tmp_path):
    class Small(tf.Module):
        def __init__(self):
            self.w = tf.Variable(RNG.normal(0, 1, (8, 8)).astype(np.float32))

        @tf.function(input_signature=[tf.TensorSpec([None, 8], tf.float32)])
        def serve(self, x):
            return {"y": tf.tanh(tf.matmul(x, self.w))}

    model = Small()
    path = str(tmp_path / "small")
    tf.saved_model.save(model, path, signatures=model.serve)
    converter = trt.TrtGraphConverterV2(input_saved_model_dir=path)
    converter.convert()
    assert converter._variables == []
    assert "ReadVariableOp" not in {n.op for n in converter._converted_graph_def.node}
    assert all(variables.weight_inputs(n) == [] for n in converter._engine_nodes())


class RunningMean(tf.Module):
    """A serving function that updates a variable as it runs (a BatchNormalization called in training mode inside
    keras-hub's DeepLabV3 does): y = relu(x @ w - mean), then mean <- 0.5 mean + 0.5 batch mean of x @ w."""

    def __init__(self):
        self.w = tf.Variable(RNG.normal(0, 0.3, (8, 8)).astype(np.float32))
        self.mean = tf.Variable(np.zeros(8, np.float32))

    @tf.function(input_signature=[tf.TensorSpec([None, 8], tf.float32)])
    def serve(self, x):
        h = tf.matmul(x, self.w)
        y = tf.nn.relu(h - self.mean)
        self.mean.assign(0.5 * self.mean + 0.5 * tf.reduce_mean(h, axis=0))
        return {"y": y}


@pytest.mark.parametrize("keep_bytes", ["0", str(1 << 30)])
def test_variables_the_model_writes_stay_variables_and_update_as_natively(tmp_path, monkeypatch, keep_bytes):
    monkeypatch.setenv(settings.KEEP_VARIABLES.name, keep_bytes)  # the rest saved as variables, or as constants
    model = RunningMean()
    tf.saved_model.save(model, str(tmp_path / "model"), signatures=model.serve)
    converter = trt.TrtGraphConverterV2(input_saved_model_dir=str(tmp_path / "model"),
                                        conversion_params=trt.TrtConversionParams(minimum_segment_size=1))
    converter.convert()
    converter.save(str(tmp_path / "trt"))
    native = tf.saved_model.load(str(tmp_path / "model")).signatures["serving_default"]
    served = tf.saved_model.load(str(tmp_path / "trt")).signatures["serving_default"]
    for batch in (4, 4, 2):  # each call sees the mean the one before wrote
        x = tf.constant(RNG.normal(0, 1, (batch, 8)).astype(np.float32))
        np.testing.assert_allclose(served(x=x)["y"].numpy(), native(x=x)["y"].numpy(), rtol=1e-5, atol=1e-5)
    ops = {n.op for n in converter._converted_graph_def.node}
    assert {"AssignVariableOp", "TRTEngineOp"} <= ops
