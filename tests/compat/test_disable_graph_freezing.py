"""TF_TRT_EXPERIMENTAL_FEATURES=disable_graph_freezing (TF-TRT's trt_convert_test `_TestVariableHelper`,
testReadVariableOp, testResourceGather and the tests run `run_all_without_freezing`): the variables stay
variables, engines take their values as weights, and the saved model keeps its checkpoint."""
import logging
import os

import numpy as np
import pytest
import tensorflow as tf

from harness import TOLERANCE
from support import saved_module
from tftrt_py import trt_convert as trt
from tftrt_py.convert import variables
from tftrt_py.convert.build import SegmentGraph, build_engine
from tftrt_py.engine_op import dispatcher

RNG = np.random.default_rng(1919)
#: build()'s batches; served after loading by the engines built for them (an engine for another shape built at
#: serving time needs the dispatcher to bind its weights: see test_a_shape_first_seen_after_loading_is_served)
BATCHES = (4, 3, 2)


class VariableModel(tf.Module):
    """Two engines around a cumsum (no converter): conv weights, a dense layer, a variable read once and used
    by both engines, and an embedding lookup (ResourceGather, native) feeding the second engine."""

    def __init__(self):
        def var(*shape):
            return tf.Variable(RNG.normal(0, 0.5, shape).astype(np.float32))

        self.filter, self.bias, self.shared = var(3, 3, 3, 4), var(4), var(4)
        self.dense, self.embedding = var(4, 5), var(10, 5)

    @tf.function(input_signature=[tf.TensorSpec([None, 8, 8, 3], tf.float32), tf.TensorSpec([None], tf.int32)])
    def run(self, x, ids):
        shared = self.shared.read_value()
        y = tf.nn.relu(tf.nn.bias_add(tf.nn.conv2d(x, self.filter, 1, "SAME"), self.bias) * shared)
        c = tf.math.cumsum(tf.reduce_mean(y, axis=[1, 2]), axis=1)
        z = tf.matmul(c * shared, self.dense) + tf.nn.embedding_lookup(self.embedding, ids)
        return {"output": tf.tanh(z)}


def inputs(batch):
    return {"x": RNG.normal(0, 1, (batch, 8, 8, 3)).astype(np.float32),
            "ids": RNG.integers(0, 10, batch).astype(np.int32)}


@pytest.fixture
def without_freezing(monkeypatch):
    monkeypatch.setenv(variables.EXPERIMENTAL_FEATURES_ENV, f"some_feature, {variables.DISABLE_GRAPH_FREEZING}")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    model = VariableModel()
    return saved_module(model, model.run, tmp_path_factory, "variables")


def engine_nodes(converter):
    return [n for n in converter._converted_graph_def.node if n.op == "TRTEngineOp"]


def graph_ops(converter):
    return {n.op for n in converter._converted_graph_def.node}


def assert_close(got, want, precision):
    tol = TOLERANCE[precision]
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)


# -- the switch ----------------------------------------------------------------------------------------------
def test_freezing_is_the_default(model_dir, monkeypatch):
    monkeypatch.delenv(variables.EXPERIMENTAL_FEATURES_ENV, raising=False)
    converter = trt.TrtGraphConverterV2(input_saved_model_dir=model_dir, use_dynamic_shape=True)
    assert converter.freeze
    converter.convert()
    assert "ReadVariableOp" not in graph_ops(converter)
    assert all(variables.weight_inputs(n) == [] for n in engine_nodes(converter))


def test_feature_named_among_others_disables_freezing(model_dir, without_freezing):
    converter = trt.TrtGraphConverterV2(input_saved_model_dir=model_dir, use_dynamic_shape=True)
    assert not converter.freeze
    converter.convert()
    assert {"ReadVariableOp", "ResourceGather"} <= graph_ops(converter)


def test_without_dynamic_shapes_the_graph_is_frozen_with_a_warning(model_dir, without_freezing, caplog):
    with caplog.at_level(logging.WARNING):
        converter = trt.TrtGraphConverterV2(input_saved_model_dir=model_dir)
    assert converter.freeze
    assert "Disabling graph freezing is only possible in dynamic shape mode. The graph will be frozen." in caplog.text
    converter.convert()
    assert "ReadVariableOp" not in graph_ops(converter)


# -- conversion, build, save, load ---------------------------------------------------------------------------
def tf1_reference_variable_model(path):
    """TF-TRT's tf_variablev2_saved_model: a TF1 graph computing input1 * var1 + input2 * var2 - 45 with reference
    variables (VariableV2) of 13 and 37."""
    v1 = tf.compat.v1
    with tf.Graph().as_default() as graph:
        input1 = v1.placeholder(tf.float32, [None, 1, 1], name="input1")
        input2 = v1.placeholder(tf.float32, [None, 1, 1], name="input2")
        var1 = v1.Variable(np.full((1, 1, 1), 13.0, np.float32), name="var1", use_resource=False)
        var2 = v1.Variable(np.full((1, 1, 1), 37.0, np.float32), name="var2", use_resource=False)
        output = tf.identity(input1 * var1 + input2 * var2 - 45.0, name="output")
        signature = v1.saved_model.signature_def_utils.predict_signature_def(
            {"input1": input1, "input2": input2}, {"output": output})
        builder = v1.saved_model.Builder(path)
        with v1.Session(graph=graph) as sess:
            sess.run(v1.global_variables_initializer())
            builder.add_meta_graph_and_variables(sess, ["serve"], signature_def_map={"serving_default": signature})
        builder.save()
    assert {"VariableV2"} <= {n.op for n in graph.as_graph_def().node}


def test_tf1_reference_variables_cannot_stay_variables_so_their_graph_is_frozen_with_a_warning(
        without_freezing, tmp_path, caplog):
    """No function can capture a VariableV2 (it is state of the graph holding it; saved again inside a function it
    would be a new, uninitialized variable): the converter freezes that graph, says so, and the model serves."""
    source, out = str(tmp_path / "tf1"), str(tmp_path / "trt")
    tf1_reference_variable_model(source)
    params = trt.TrtConversionParams(precision_mode="FP16", minimum_segment_size=3)
    converter = trt.TrtGraphConverterV2(input_saved_model_dir=source, conversion_params=params,
                                        use_dynamic_shape=True, dynamic_shape_profile_strategy="Optimal")
    with caplog.at_level(logging.WARNING):
        converter.convert()
    assert "holds TF1 reference variables (VariableV2), which cannot stay variables" in caplog.text
    assert converter.freeze and len(engine_nodes(converter)) == 1
    assert not {"VariableV2", "ReadVariableOp"} & graph_ops(converter)
    converter.build(lambda: iter([[np.ones((4, 1, 1), np.float32)] * 2]))
    converter.save(out)
    served = tf.saved_model.load(out).signatures["serving_default"]
    got = served(input1=tf.ones([4, 1, 1]), input2=2 * tf.ones([4, 1, 1]))["output"].numpy()
    np.testing.assert_allclose(got, np.full((4, 1, 1), 42.0), rtol=1e-3)


@pytest.mark.parametrize("precision", ["FP32", "FP16"])
def test_converted_model_keeps_its_variables_and_serves_as_the_original(model_dir, without_freezing, tmp_path,
                                                                        precision):
    converter = trt.TrtGraphConverterV2(input_saved_model_dir=model_dir, use_dynamic_shape=True,
                                        precision_mode=precision)
    converter.convert()
    nodes = engine_nodes(converter)
    assert len(nodes) == 2
    reads = {n.name for n in converter._converted_graph_def.node if n.op == "ReadVariableOp"}
    weights = [{n.input[i].split(":")[0] for i in variables.weight_inputs(n)} for n in nodes]
    assert all(w and w <= reads for w in weights)
    assert weights[0] & weights[1]  # the shared variable's one read feeds both engines
    converter.build(input_fn=lambda: iter([inputs(b) for b in BATCHES]))
    out = str(tmp_path / "converted")
    converter.save(out)

    saved = tf.train.list_variables(os.path.join(out, "variables", "variables"))
    assert sum(name.endswith("VARIABLE_VALUE") for name, _ in saved) == 5
    loaded = tf.saved_model.load(out)
    original = tf.saved_model.load(model_dir)
    serve, want = loaded.signatures["serving_default"], original.signatures["serving_default"]
    contents = lambda vs: sorted((tuple(v.shape), v.numpy().tobytes()) for v in vs)  # noqa: E731
    assert len(serve.variables) == 5 and contents(serve.variables) == contents(want.variables)
    for batch in BATCHES:
        feeds = {k: tf.constant(v) for k, v in inputs(batch).items()}
        assert_close(serve(**feeds)["output"].numpy(), want(**feeds)["output"].numpy(), precision)
    stats = trt.engine_op_stats()
    for node in nodes:
        assert stats[node.name]["engine_runs"] == len(BATCHES) and stats[node.name]["fallback_total"] == 0


def test_engines_keep_the_values_they_were_built_with(model_dir, without_freezing, tmp_path):
    """As TF-TRT's: assigning a variable after build() changes the native ops (here the embedding lookup),
    not the engines (here the dense layer's weights)."""
    converter = trt.TrtGraphConverterV2(input_saved_model_dir=model_dir, use_dynamic_shape=True)
    converter.convert()
    converter.build(input_fn=lambda: iter([inputs(b) for b in BATCHES]))
    out = str(tmp_path / "converted")
    converter.save(out)
    loaded, original = tf.saved_model.load(out), tf.saved_model.load(model_dir)
    serve, want = loaded.signatures["serving_default"], original.signatures["serving_default"]
    by_shape = {tuple(v.shape): v for v in serve.variables}
    feeds = {k: tf.constant(v) for k, v in inputs(3).items()}
    before = serve(**feeds)["output"].numpy()

    by_shape[(4, 5)].assign(RNG.normal(0, 0.5, (4, 5)).astype(np.float32))  # dense: in an engine
    assert_close(serve(**feeds)["output"].numpy(), before, "FP32")

    embedding = RNG.normal(0, 0.5, (10, 5)).astype(np.float32)  # embedding: read natively
    by_shape[(10, 5)].assign(embedding)
    next(v for v in want.variables if tuple(v.shape) == (10, 5)).assign(embedding)
    got = serve(**feeds)["output"].numpy()
    assert_close(got, want(**feeds)["output"].numpy(), "FP32")
    assert np.abs(got - before).max() > 1e-3


def test_a_shape_first_seen_after_loading_is_served(model_dir, without_freezing, tmp_path):
    """Batch 5 lies outside the profile built: the loaded op takes the variables' values from its inputs and
    builds an engine for it, no native fallback."""
    converter = trt.TrtGraphConverterV2(input_saved_model_dir=model_dir, use_dynamic_shape=True)
    converter.convert()
    converter.build(input_fn=lambda: iter([inputs(b) for b in BATCHES]))
    out = str(tmp_path / "converted")
    converter.save(out)
    serve = tf.saved_model.load(out).signatures["serving_default"]
    want = tf.saved_model.load(model_dir).signatures["serving_default"]
    feeds = {k: tf.constant(v) for k, v in inputs(5).items()}
    assert_close(serve(**feeds)["output"].numpy(), want(**feeds)["output"].numpy(), "FP32")
    served = [s for name, s in dispatcher.stats().items() if s["engine_runs"]]
    assert served and all(s["fallback_total"] == 0 for s in served)


def conv_segment():
    """A segment Conv2D(input 0, filter input 1) and its engine op node, input 1 marked a weight."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None, 6, 6, 3], name="TensorRTInputPH_0")
        w = tf.compat.v1.placeholder(tf.float32, [3, 3, 3, 4], name="TensorRTInputPH_1")
        tf.identity(tf.nn.conv2d(x, w, 1, "SAME"), name="TensorRTOutputPH_0")
    node = tf.compat.v1.NodeDef(name="TRTEngineOp_000_000", op="TRTEngineOp")
    node.attr[variables.WEIGHT_INPUTS_ATTR].list.i.append(1)
    return SegmentGraph.from_graph_def(graph.as_graph_def()), node


def test_bind_weights_gives_an_engine_built_at_serving_time_its_weights():
    """What an engine op building at run time calls with its inputs: the engine takes the weight inputs'
    values as weights (a Conv2D filter must be one) and binds only the other inputs; values bound once
    stay (later ones are ignored, as engines keep the weights they were built with)."""
    shapes = [(2, 6, 6, 3), (3, 3, 3, 4)]
    x, w = (RNG.normal(0, 1, s).astype(np.float32) for s in shapes)
    segment, node = conv_segment()
    with pytest.raises(Exception, match="must be a constant"):
        build_engine(segment, shapes)
    variables.bind_weights(segment, node, [x, w])
    variables.bind_weights(segment, node, [x, w + 1])
    engine = build_engine(segment, shapes[:1])
    assert [t.shape for t in engine.inputs] == [shapes[0]]
    (got,) = engine.create_execution_context().execute_v2([x])
    want = tf.nn.conv2d(x, w, 1, "SAME").numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_bound_weights_are_copies_unless_the_caller_says_nothing_writes_them():
    segment, node = conv_segment()
    w = RNG.normal(0, 1, (3, 3, 3, 4)).astype(np.float32)
    variables.bind_weights(segment, node, [None, w])
    assert not np.shares_memory(segment.weights[1], w)
    segment, node = conv_segment()
    variables.bind_weights(segment, node, {1: w}, copy=False)
    assert segment.weights[1] is w


def test_a_weight_of_another_shape_than_the_segment_takes_is_refused():
    segment, node = conv_segment()
    variables.bind_weights(segment, node, [None, np.ones((3, 3, 3, 5), np.float32)])
    with pytest.raises(Exception, match=r"weight input 1 holds float32\[3, 3, 3, 5\], but the segment takes "
                                        r"float32\[3, 3, 3, 4\]"):
        build_engine(segment, [(2, 6, 6, 3)])
