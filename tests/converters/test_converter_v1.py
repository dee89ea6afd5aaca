"""TrtGraphConverter (TF1 API, tf.compat.v1 graph mode): static and dynamic ops, calibration, save, errors,
and the user guide's TF1 workflows (sections 2.2.1-2.2.3, 2.9.1) with only the import line changed."""
import logging
import os

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.saved_model import signature_constants, tag_constants

from support import random_array
from tftrt_py import trt_convert as trt  # the only change: was tensorflow.python.compiler.tensorrt
from tftrt_py.convert.errors import AlreadyConvertedError
from tftrt_py.engine_op import dispatcher
from tftrt_py.engine_op import op as engine_op

RNG = np.random.default_rng(7)
WEIGHTS = {"w1": RNG.normal(0, 0.3, (16, 32)).astype("float32"), "b1": RNG.normal(0, 0.1, (32,)).astype("float32"),
           "w2": RNG.normal(0, 0.3, (32, 10)).astype("float32")}


def build_mlp(variables=False, default_input=None):
    """In the default graph: input [?, 16] -> dense+relu -> dense -> logits (Identity), classes (ArgMax).

    With `default_input` the input is a PlaceholderWithDefault (the graph runs without feeds).
    """
    make = ((lambda name, v: tf.compat.v1.get_variable(name, initializer=v)) if variables
            else (lambda name, v: tf.constant(v, name=name)))
    if default_input is None:
        x = tf.compat.v1.placeholder(tf.float32, [None, 16], name="input")
    else:
        x = tf.compat.v1.placeholder_with_default(default_input, [None, 16], name="input")
    h = tf.nn.relu(tf.nn.bias_add(tf.matmul(x, make("w1", WEIGHTS["w1"])), make("b1", WEIGHTS["b1"])))
    logits = tf.identity(tf.matmul(h, make("w2", WEIGHTS["w2"])), name="logits")
    return x, logits, tf.argmax(logits, 1, name="classes")


def expected(x):
    logits = np.maximum(x @ WEIGHTS["w1"] + WEIGHTS["b1"], 0) @ WEIGHTS["w2"]
    return logits, logits.argmax(1)


@pytest.fixture
def frozen_graph():
    graph = tf.Graph()
    with graph.as_default():
        build_mlp()
    return graph.as_graph_def()


@pytest.fixture
def tf1_saved_model(tmp_path):
    """A TF1 SavedModel (variables, a serving_default signature) built with SavedModelBuilder."""
    path = str(tmp_path / "tf1_model")
    with tf.Graph().as_default():
        x, logits, classes = build_mlp(variables=True)
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            signature = tf.compat.v1.saved_model.predict_signature_def(
                inputs={"x": x}, outputs={"logits": logits, "classes": classes})
            builder = tf.compat.v1.saved_model.Builder(path)
            builder.add_meta_graph_and_variables(sess, [tag_constants.SERVING], signature_def_map={
                signature_constants.DEFAULT_SERVING_SIGNATURE_DEF_KEY: signature})
            builder.save()
    return path


def engine_nodes(graph_def):
    return [n for n in graph_def.node if n.op == "TRTEngineOp"]


def op_stats(graph_def):
    """Stats of the only engine op of `graph_def`, with its engine count."""
    (node,) = engine_nodes(graph_def)
    op = dispatcher.find(node.attr["segment_key"].s.decode())
    return dict(op.stats.as_dict(), engines=len(op.cache))


def run_graph(graph_def, x, fetches=("logits:0", "classes:0")):
    with tf.Graph().as_default():
        tf.import_graph_def(graph_def, name="")
        with tf.compat.v1.Session() as sess:
            return sess.run(list(fetches), {"input:0": x})


#: the running test's converters: while a converter lives its engine ops outlive each session that runs them, so
#: op_stats() reads the counts of every run_graph() of a test (without it, each session gets fresh engine ops)
_converters = []


@pytest.fixture(autouse=True)
def _keep_converters():
    yield
    _converters.clear()


def convert(graph_def, **kwargs):
    with tf.Graph().as_default():
        converter = trt.TrtGraphConverter(input_graph_def=graph_def, nodes_denylist=["logits", "classes"], **kwargs)
        _converters.append(converter)
        return converter.convert()


def assert_right(outputs, x):
    want_logits, want_classes = expected(x)
    np.testing.assert_allclose(outputs[0], want_logits, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(outputs[1], want_classes)


# -- constructor and method errors (TF-TRT's) ------------------------------------------------------------
def test_eager_mode_is_refused(frozen_graph):
    with pytest.raises(RuntimeError, match="Please use tf.experimental.tensorrt.Converter in TF 2.0."):
        trt.TrtGraphConverter(input_graph_def=frozen_graph)


def test_constructor_errors(frozen_graph):
    with tf.Graph().as_default():
        with pytest.raises(ValueError, match="Can only specify one of input_graph_def and input_saved_model_dir"):
            trt.TrtGraphConverter(input_graph_def=frozen_graph, input_saved_model_dir="somewhere")
        with pytest.raises(ValueError, match="Must specify one of input_graph_def and input_saved_model_dir"):
            trt.TrtGraphConverter()
        with pytest.raises(ValueError, match="When is_dynamic_op==False max_batch_size should be an integer"):
            trt.TrtGraphConverter(input_graph_def=frozen_graph, max_batch_size=None)
        with pytest.raises(ValueError, match="Calibration requires enabling fallback to TF function execution"):
            trt.TrtGraphConverter(input_graph_def=frozen_graph, precision_mode="INT8", use_function_backup=False)
        with pytest.raises(ValueError, match="precision mode 'FP64' is not supported"):
            trt.TrtGraphConverter(input_graph_def=frozen_graph, precision_mode="FP64")


def test_graph_def_input_needs_the_output_nodes(frozen_graph):
    with tf.Graph().as_default():
        with pytest.raises(ValueError, match="needs nodes_denylist"):
            trt.TrtGraphConverter(input_graph_def=frozen_graph).convert()


def test_convert_twice_is_an_error_saying_to_make_a_new_converter(frozen_graph):
    with tf.Graph().as_default():
        converter = trt.TrtGraphConverter(input_graph_def=frozen_graph, nodes_denylist=["logits", "classes"])
        converted = converter.convert()
        with pytest.raises(AlreadyConvertedError, match="^convert\\(\\) was already called on this TrtGraphConverter; "
                                                        "a converter converts once: make a new TrtGraphConverter to "
                                                        "convert again$"):
            converter.convert()
        assert converter._converted_graph_def is converted


def test_save_needs_a_saved_model_input(frozen_graph, tmp_path):
    with tf.Graph().as_default():
        converter = trt.TrtGraphConverter(input_graph_def=frozen_graph, nodes_denylist=["logits", "classes"])
        converter.convert()
        with pytest.raises(ValueError, match="Not able to save to a SavedModel since input is a GraphDef"):
            converter.save(str(tmp_path / "out"))


# -- dynamic and static ops ------------------------------------------------------------------------------
def test_dynamic_op_builds_per_shape_and_evicts(frozen_graph):
    trt_graph = convert(frozen_graph, is_dynamic_op=True, max_batch_size=None, maximum_cached_engines=2)
    (node,) = engine_nodes(trt_graph)
    assert not node.attr["static_engine"].b and node.attr["serialized_segment"].s == b""
    with tf.Graph().as_default():
        tf.import_graph_def(trt_graph, name="")
        with tf.compat.v1.Session() as sess:
            for batch in (1, 2, 3, 1):  # batch 3 evicts batch 1's engine; batch 1 then runs on batch 2's
                x = random_array((batch, 16))
                assert_right(sess.run(["logits:0", "classes:0"], {"input:0": x}), x)
    stats = op_stats(trt_graph)
    assert {k: stats[k] for k in ("builds", "evictions", "hits", "engines", "fallback_total")} == dict(
        builds=3, evictions=1, hits=1, engines=2, fallback_total=0)


def test_static_op_serves_up_to_max_batch_size_and_falls_back_above(frozen_graph):
    trt_graph = convert(frozen_graph, max_batch_size=1)
    (node,) = engine_nodes(trt_graph)
    assert node.attr["static_engine"].b and node.attr["max_batch_size"].i == 1
    assert node.attr["serialized_segment"].s.startswith(b"TFTRTPLN")  # the plan, built by convert()
    assert not node.attr["_allow_build_at_runtime"].b
    for batch in (1, 2):
        x = random_array((batch, 16))
        assert_right(run_graph(trt_graph, x), x)
    stats = op_stats(trt_graph)
    assert stats["builds"] == 0 and stats["hits"] == 1 and stats["fallbacks"] == {"no_engine": 1}


def test_static_row_wise_engine_serves_smaller_batches(frozen_graph):
    trt_graph = convert(frozen_graph, max_batch_size=4)
    for batch in (4, 3, 1):
        x = random_array((batch, 16))
        assert_right(run_graph(trt_graph, x), x)
    stats = op_stats(trt_graph)
    assert stats["builds"] == 0 and stats["hits"] == 3 and stats["fallback_total"] == 0


def annotated(graph_def, caps):
    """A copy of `graph_def` with TF-TRT's _tftrt_op_max_batch_size int attr on the nodes of `caps`."""
    out = type(graph_def)()
    out.CopyFrom(graph_def)
    for node in out.node:
        if node.name in caps:
            node.attr["_tftrt_op_max_batch_size"].i = caps[node.name]
    return out


def test_max_batch_size_annotations_cap_the_static_engine(frozen_graph):
    (matmul, relu) = [n.name for n in frozen_graph.node if n.op in ("MatMul", "Relu")][:2]
    trt_graph = convert(annotated(frozen_graph, {matmul: 2, relu: 2}), max_batch_size=8)
    (node,) = engine_nodes(trt_graph)
    assert node.attr["max_batch_size"].i == 2  # the annotation, not the converter's 8
    for batch in (2, 3):
        x = random_array((batch, 16))
        assert_right(run_graph(trt_graph, x), x)
    stats = op_stats(trt_graph)
    assert stats["hits"] == 1 and stats["fallbacks"] == {"no_engine": 1}  # batch 3 is above the engine's 2


def test_dynamic_ops_carry_the_converters_max_batch_size(frozen_graph):
    (node,) = engine_nodes(convert(frozen_graph, is_dynamic_op=True, max_batch_size=16))
    assert node.attr["max_batch_size"].i == 16


def test_static_mode_with_unknown_dims_warns_and_goes_dynamic(caplog):
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None, None], name="input")
        tf.tanh(tf.nn.relu(x * 2.0 + 1.0) - 0.5, name="out")
    with tf.Graph().as_default(), caplog.at_level(logging.WARNING):
        converter = trt.TrtGraphConverter(input_graph_def=graph.as_graph_def(), nodes_denylist=["out"])
        trt_graph = converter.convert()  # the converter lives to the end: op_stats() reads its op
    assert "Input shapes must be fully defined when in static mode. Please try is_dynamic_op=True." in caplog.text
    (node,) = engine_nodes(trt_graph)
    assert not node.attr["static_engine"].b and node.attr["_allow_build_at_runtime"].b
    x = random_array((2, 5))
    (got,) = run_graph(trt_graph, x, fetches=["out:0"])
    np.testing.assert_allclose(got, np.tanh(np.maximum(x * 2 + 1, 0) - 0.5), rtol=1e-5, atol=1e-6)
    assert op_stats(trt_graph)["builds"] == 1


def test_int8_calibration_switches_static_mode_to_dynamic(frozen_graph, caplog):
    with tf.Graph().as_default(), caplog.at_level(logging.WARNING):
        converter = trt.TrtGraphConverter(input_graph_def=frozen_graph, nodes_denylist=["logits", "classes"],
                                          precision_mode="INT8", use_calibration=True, is_dynamic_op=False)
        trt_graph = converter.convert()
    assert "INT8 precision mode with calibration is supported with dynamic TRT ops only" in caplog.text
    (node,) = engine_nodes(trt_graph)
    assert not node.attr["static_engine"].b and node.attr["serialized_segment"].s == b""
    assert node.attr["precision_mode"].s == b"INT8" and node.attr["use_calibration"].b


def test_nodes_blacklist_keeps_the_named_outputs_native(frozen_graph):
    def ops(nodes):
        with tf.Graph().as_default():
            trt_graph = trt.TrtGraphConverter(input_graph_def=frozen_graph, max_batch_size=2, **nodes).convert()
        return {n.name: n.op for n in trt_graph.node if n.op != "TRTEngineOp"}, len(engine_nodes(trt_graph))

    blacklisted = ops({"nodes_blacklist": ["logits", "classes"]})
    assert blacklisted == ({"input": "Placeholder", "classes/dimension": "Const", "logits": "Identity",
                            "classes": "ArgMax"}, 1)
    assert ops({"nodes_denylist": ["logits", "classes"]}) == blacklisted  # the new name, same meaning
    with tf.Graph().as_default() as graph:  # a tensor name or a tf.Tensor names the node as well
        tf.import_graph_def(frozen_graph, name="")
        assert ops({"nodes_blacklist": ["logits:0", graph.get_tensor_by_name("classes:0")]}) == blacklisted


def test_without_function_backup_an_unservable_input_is_an_error(frozen_graph):
    trt_graph = convert(frozen_graph, max_batch_size=2, use_function_backup=False)
    (node,) = engine_nodes(trt_graph)
    assert node.attr["segment_func"].func.name == ""
    x = random_array((2, 16))
    assert_right(run_graph(trt_graph, x), x)
    with pytest.raises(tf.errors.FailedPreconditionError, match="native segment is unavailable"):
        run_graph(trt_graph, random_array((3, 16)))


def test_dynamic_op_without_function_backup_builds_from_its_serialized_segment(frozen_graph):
    trt_graph = convert(frozen_graph, is_dynamic_op=True, max_batch_size=None, use_function_backup=False)
    (node,) = engine_nodes(trt_graph)
    assert node.attr["segment_func"].func.name == "" and node.attr["serialized_segment"].s
    x = random_array((3, 16))
    assert_right(run_graph(trt_graph, x), x)
    assert op_stats(trt_graph)["builds"] == 1


def test_forbidden_native_fallback_is_an_error(frozen_graph, monkeypatch):
    trt_graph = convert(frozen_graph, max_batch_size=1)
    monkeypatch.setenv(engine_op.FALLBACK_ENV, "0")
    x = random_array((1, 16))
    assert_right(run_graph(trt_graph, x), x)
    with pytest.raises(tf.errors.AbortedError, match="User disallowed engine native segment execution"):
        run_graph(trt_graph, random_array((2, 16)))


# -- calibration -----------------------------------------------------------------------------------------
def test_calibrate_errors(frozen_graph):
    with tf.Graph().as_default():
        converter = trt.TrtGraphConverter(input_graph_def=frozen_graph, nodes_denylist=["logits", "classes"],
                                          precision_mode="INT8")
        converter.convert()
        with pytest.raises(ValueError, match="Should specify one and only one of feed_dict_fn and input_map_fn."):
            converter.calibrate(["logits"], 1)
        with pytest.raises(ValueError, match="Should specify one and only one of feed_dict_fn and input_map_fn."):
            converter.calibrate(["logits"], 1, feed_dict_fn=dict, input_map_fn=dict)
        with pytest.raises(ValueError, match="Keys of input_map_fn must be of type str"):
            converter.calibrate(["logits"], 1, input_map_fn=lambda: {0: tf.constant(random_array((1, 16)))})
        with pytest.raises(ValueError, match="Values of input_map_fn must be of type tf.Tensor"):
            converter.calibrate(["logits"], 1, input_map_fn=lambda: {"input:0": random_array((1, 16))})


@pytest.mark.parametrize("how", ["feed_dict_fn", "input_map_fn"])
def test_calibrate_runs_the_graph_and_fills_calibration_data(frozen_graph, tmp_path, how, monkeypatch):
    runs = []
    original_run = dispatcher.EngineOp.run

    def counting_run(self, arrays, *args, **kwargs):
        runs.append(arrays[0].shape)
        return original_run(self, arrays, *args, **kwargs)

    monkeypatch.setattr(dispatcher.EngineOp, "run", counting_run)
    monkeypatch.setattr(dispatcher.EngineOp, "calibration_table", lambda self: b"calibration table of " +
                        self.name.encode(), raising=False)
    with tf.Graph().as_default():
        converter = trt.TrtGraphConverter(input_graph_def=frozen_graph, nodes_blacklist=["logits", "classes"],
                                          precision_mode="INT8", use_calibration=True)
        converter.convert()
        if how == "feed_dict_fn":
            kwargs = {"feed_dict_fn": lambda: {"input:0": random_array((8, 16))}}
        else:  # as the guide's input_map_fn: a tf.data iterator's tensor (a constant would be folded away)
            def input_map_fn():  # called in the calibration graph: the dataset is made there too
                dataset = tf.data.Dataset.from_tensors(random_array((8, 16))).repeat()
                return {"input:0": tf.compat.v1.data.make_one_shot_iterator(dataset).get_next()}
            kwargs = {"input_map_fn": input_map_fn}
        trt_graph = converter.calibrate(fetch_names=["logits", "classes"], num_runs=3, **kwargs)
    assert runs == [(8, 16)] * 3

    # --- the guide's table extraction loop (2.9.1), with tf.gfile as tf.compat.v1.gfile ---
    written = []
    for n in trt_graph.node:
        if n.op == "TRTEngineOp":
            print("Node: %s, %s" % (n.op, n.name.replace("/", "_")))
            path = str(tmp_path / ("%s.calib_table" % (n.name.replace("/", "_"))))
            with tf.compat.v1.gfile.GFile(path, 'wb') as f:
                f.write(n.attr["calibration_data"].s)
            written.append(path)
    # --- end of the guide's code ---
    (path,) = written
    with open(path, "rb") as f:
        assert f.read() == b"calibration table of " + engine_nodes(trt_graph)[0].name.encode()
    x = random_array((2, 16))  # a table that is no table gives no ranges: the engine builds without int8 (FP16)
    np.testing.assert_allclose(run_graph(trt_graph, x)[0], expected(x)[0], rtol=1e-2, atol=1e-2)


def test_calibration_data_is_empty_until_the_dispatcher_collects_tables(frozen_graph):
    with tf.Graph().as_default():
        converter = trt.TrtGraphConverter(input_graph_def=frozen_graph, nodes_denylist=["logits", "classes"],
                                          precision_mode="INT8")
        converter.convert()
        trt_graph = converter.calibrate(["logits"], 1, feed_dict_fn=lambda: {"input:0": random_array((2, 16))})
    if not hasattr(dispatcher.EngineOp, "calibration_table"):
        assert all(n.attr["calibration_data"].s == b"" for n in engine_nodes(trt_graph))
    assert "calibration_data" in engine_nodes(trt_graph)[0].attr


# -- the user guide's TF1 workflows --------------------------------------------------------------------
def test_tf1_workflow_with_a_saved_model(tf1_saved_model, tmp_path):
    input_saved_model_dir, output_saved_model_dir = tf1_saved_model, str(tmp_path / "converted")
    input_data = random_array((8, 16))
    with tf.Graph().as_default():
        # --- the guide's code (2.2.1), with TF1 names under tf.compat.v1 ---
        converter = trt.TrtGraphConverter(
            input_saved_model_dir=input_saved_model_dir,
            max_workspace_size_bytes=(1 << 32),
            precision_mode="FP16",
            maximum_cached_engines=100,
            max_batch_size=8)
        converter.convert()
        converter.save(output_saved_model_dir)
        with tf.compat.v1.Session() as sess:
            # First load the SavedModel into the session
            meta_graph = tf.compat.v1.saved_model.loader.load(
                sess, [tf.compat.v1.saved_model.tag_constants.SERVING],
                output_saved_model_dir)
            signature = meta_graph.signature_def["serving_default"]
            input_tensor = signature.inputs["x"].name
            output_tensor = signature.outputs["logits"].name
            output = sess.run([output_tensor], feed_dict={input_tensor: input_data})
        # --- end of the guide's code ---
            assert any(n.op == "TRTEngineOp" for n in sess.graph.as_graph_def().node)
            node = next(n for n in sess.graph.as_graph_def().node if n.op == "TRTEngineOp")
            assert node.attr["static_engine"].b and node.attr["precision_mode"].s == b"FP16"
    np.testing.assert_allclose(output[0], expected(input_data)[0], rtol=1e-2, atol=1e-2)  # FP16 tolerance


def test_saved_model_input_keeps_the_signature_and_other_tags_fail(tf1_saved_model, tmp_path):
    with tf.Graph().as_default():
        converter = trt.TrtGraphConverter(input_saved_model_dir=tf1_saved_model, max_batch_size=4)
        trt_graph = converter.convert()
        converter.save(str(tmp_path / "out"))
    assert {n.name: n.op for n in trt_graph.node}["classes"] == "ArgMax"  # signature outputs stay native
    x = random_array((4, 16))
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        meta_graph = tf.compat.v1.saved_model.loader.load(sess, [tag_constants.SERVING], str(tmp_path / "out"))
        signature = meta_graph.signature_def["serving_default"]
        assert set(signature.outputs) == {"logits", "classes"} and signature.method_name.endswith("predict")
        got = sess.run([signature.outputs["logits"].name, signature.outputs["classes"].name],
                       {signature.inputs["x"].name: x})
    assert_right(got, x)
    with tf.Graph().as_default():
        with pytest.raises(ValueError, match="has no signature 'nope'"):
            trt.TrtGraphConverter(input_saved_model_dir=tf1_saved_model,
                                  input_saved_model_signature_key="nope").convert()


def test_tf1_workflow_with_a_frozen_graph(tmp_path):
    default_input = random_array((4, 16))
    graph = tf.Graph()
    with graph.as_default():
        build_mlp(default_input=default_input)  # the guide runs the graph without feeds
    path = str(tmp_path / "frozen_graph.pb")
    with open(path, "wb") as f:
        f.write(graph.as_graph_def().SerializeToString())
    input_data = random_array((1, 16))
    with tf.Graph().as_default():
        with tf.compat.v1.Session() as sess:
            # --- the guide's code (2.2.2), with TF1 names under tf.compat.v1 ---
            # First deserialize your frozen graph:
            with tf.compat.v1.gfile.GFile(path, 'rb') as f:
                frozen_graph = tf.compat.v1.GraphDef()
                frozen_graph.ParseFromString(f.read())
            # Now you can create a TensorRT inference graph from your
            # frozen graph:
            converter = trt.TrtGraphConverter(
                input_graph_def=frozen_graph,
                nodes_blacklist=['logits', 'classes'])  # output nodes
            trt_graph = converter.convert()
            # Import the TensorRT graph into a new graph and run:
            output_node = tf.import_graph_def(
                trt_graph,
                return_elements=['logits', 'classes'])
            sess.run(output_node)
            # --- end of the guide's code ---
            outputs = [sess.run(["import/logits:0", "import/classes:0"], feed_dict=feed)
                       for feed in ({}, {"import/input:0": input_data})]
    assert_right(outputs[0], default_input)
    assert_right(outputs[1], input_data)
    assert op_stats(trt_graph)["hits"] == 1 and op_stats(trt_graph)["fallbacks"] == {"no_engine": 2}


def test_tf1_workflow_with_a_meta_graph_and_checkpoint(tmp_path):
    ckpt = str(tmp_path / "model.ckpt")
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        build_mlp(variables=True)
        sess.run(tf.compat.v1.global_variables_initializer())
        tf.compat.v1.train.Saver().save(sess, ckpt)
    with tf.Graph().as_default():
        with tf.compat.v1.Session() as sess:
            # --- the guide's code (2.2.3), with TF1 names under tf.compat.v1 ---
            # First create a `Saver` object (for saving and rebuilding a
            # model) and import your `MetaGraphDef` protocol buffer into it:
            saver = tf.compat.v1.train.import_meta_graph(ckpt + ".meta")
            # Then restore your training data from checkpoint files:
            saver.restore(sess, ckpt)
            # Finally, freeze the graph:
            frozen_graph = tf.compat.v1.graph_util.convert_variables_to_constants(
                sess,
                tf.compat.v1.get_default_graph().as_graph_def(),
                output_node_names=['logits', 'classes'])
            # --- end of the guide's code ---
        converter = trt.TrtGraphConverter(input_graph_def=frozen_graph, nodes_blacklist=['logits', 'classes'],
                                          max_batch_size=2)
        trt_graph = converter.convert()
    x = random_array((2, 16))
    assert_right(run_graph(trt_graph, x), x)
    assert op_stats(trt_graph)["hits"] == 1 and not os.path.exists(str(tmp_path / "converted"))


@pytest.mark.parametrize("disabled, erfcs", [(False, 1), (True, 2)])
def test_tf_trts_test_switch_leaves_grappler_passes_out(disabled, erfcs):
    """As TrtGraphConverterV2's: under _test_only_disable_non_trt_optimizers two equal Erfc ops stay two."""
    from tftrt_py.converters.summary import engine_op_counts

    with tf.Graph().as_default() as graph:
        x = tf.compat.v1.placeholder(tf.float32, [None, 3], name="x")
        tf.identity(tf.math.erfc(x) + tf.math.erfc(x) * 2.0, name="y")
    with tf.Graph().as_default():
        converter = trt.TrtGraphConverter(input_graph_def=graph.as_graph_def(), nodes_denylist=["y"],
                                          minimum_segment_size=2)
        converter._test_only_disable_non_trt_optimizers = disabled
        _converters.append(converter)
        graph_def = converter.convert()
    (counts,) = engine_op_counts(graph_def).values()
    assert counts["Erfc"] == erfcs
