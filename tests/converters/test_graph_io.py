"""Graph I/O: function calls are inlined before segmentation (Keras' XLA-compiled grouped convolutions too),
weights are held once, loops stay native while the ops around them convert, and a damaged saved_model.pb is one
clear error."""
import os
import shutil

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.framework import graph_pb2
from tensorflow.core.protobuf import saved_model_pb2

from support import frozen_graph_def, random_array
from tftrt_py import trt_convert as trt
from tftrt_py.convert.graph import LARGE_CONST_BYTES
from tftrt_py.converters import graph_io
from tftrt_py.converters.graph_io import CALL_OPS, inline_calls
from tftrt_py.converters.summary import weight_feeds
from tftrt_py.segmenter.control_flow import FUNCTIONAL_OPS, LOOP_REASON

W = random_array([4, 4]) / 2  # numpy: a Const in every graph


def call_ops(graph_def):
    return [n for n in graph_def.node if n.op in CALL_OPS]


def run_graph_def(graph_def, feeds, fetches):
    """Run `graph_def` (fed by {tensor name: value}) for the `fetches` tensor names, in a session."""
    with tf.Graph().as_default():
        tf.graph_util.import_graph_def(graph_def, name="")
        with tf.compat.v1.Session() as sess:
            return sess.run(list(fetches), feeds)


def traced(fn, spec):
    """(GraphDef with its calls, input name, output name) of `fn` traced (not frozen, so calls stay calls)."""
    concrete = tf.function(fn).get_concrete_function(spec)
    return concrete.graph.as_graph_def(), concrete.inputs[0].name, concrete.outputs[0].name


@tf.function
def innermost(x):
    return tf.tanh(x) + 1.0, tf.sigmoid(x)


@tf.function
def inner(x):
    a, b = innermost(x)
    return tf.matmul(a, W) * b


@tf.function(jit_compile=True)
def compiled(x):
    return tf.nn.relu(x) - 0.5


def outer(x):
    return compiled(inner(x) * 2.0) + inner(x)


# -- inline_calls ------------------------------------------------------------------------------------------
def test_nested_and_xla_compiled_calls_are_inlined_with_the_same_results():
    graph_def, x_name, y_name = traced(outer, tf.TensorSpec([3, 4]))
    assert call_ops(graph_def) and any("_XlaMustCompile" in f.attr for f in graph_def.library.function)
    inlined = inline_calls(graph_def)
    assert not call_ops(inlined)
    assert not inlined.library.function  # nothing calls them any more
    x = random_array([3, 4])
    (want,), (got,) = (run_graph_def(g, {x_name: x}, [y_name]) for g in (graph_def, inlined))
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_readers_of_each_result_and_control_dependents_of_a_call_are_rewired():
    graph_def, x_name, _ = traced(lambda x: innermost(x), tf.TensorSpec([2, 3]))
    (call,) = call_ops(graph_def)
    graph_def.node.add(name="second", op="Identity", input=[f"{call.name}:1", f"^{call.name}"]).attr["T"].type = 1
    inlined = inline_calls(graph_def)
    (second,) = (n for n in inlined.node if n.name == "second")
    body = {n.name for n in inlined.node if n.name.startswith(f"{call.name}/")}
    assert second.input[0].split(":")[0] in body and second.input[1][1:] in body
    x = random_array([2, 3])
    (got,) = run_graph_def(inlined, {x_name: x}, ["second:0"])
    np.testing.assert_allclose(got, tf.sigmoid(x).numpy(), rtol=1e-6)


def test_body_nodes_take_another_prefix_where_a_graph_node_has_their_name():
    graph_def, x_name, y_name = traced(lambda x: innermost(x)[0], tf.TensorSpec([2, 3]))
    (call,) = call_ops(graph_def)
    taken = graph_def.node.add(name=f"{call.name}/Tanh", op="Const")
    taken.attr["dtype"].type = 1
    taken.attr["value"].tensor.CopyFrom(tf.make_tensor_proto(0.0))
    inlined = inline_calls(graph_def)
    names = [n.name for n in inlined.node]
    assert len(names) == len(set(names)) and f"{call.name}_inlined_0/Tanh" in names
    x = random_array([2, 3])
    (got,) = run_graph_def(inlined, {x_name: x}, [y_name])
    np.testing.assert_allclose(got, np.tanh(x) + 1.0, rtol=1e-6, atol=1e-6)


def test_calls_named_in_keep_stay_with_their_functions():
    graph_def, _, _ = traced(outer, tf.TensorSpec([3, 4]))
    kept = {n.name for n in call_ops(graph_def) if n.attr["f"].func.name.startswith("__inference_compiled")}
    inlined = inline_calls(graph_def, keep=kept)
    assert {n.name for n in call_ops(inlined)} == kept
    assert [f.signature.name for f in inlined.library.function] == [
        n.attr["f"].func.name for n in call_ops(inlined)]


# -- optimize: weights pass grappler as stand-ins ----------------------------------------------------------
class ReadsInACall(tf.Module):
    """A call reading twelve weights and returning two results: inlined, both results wait on a NoOp that waits on
    every read (the call's control outputs), too many edges for grappler to fold the NoOp away."""

    def __init__(self):
        self.w = [tf.Variable(random_array([128, 128]) / 16) for _ in range(12)]  # 64 KiB each: LARGE_CONST_BYTES

    @tf.function
    def dense(self, x):
        for w in self.w:
            x = tf.nn.relu(tf.matmul(x, w))
        return {"y": x, "z": x + 1.0}

    @tf.function(input_signature=[tf.TensorSpec([None, 128], tf.float32)])
    def serve(self, x):
        return self.dense(x)


def test_weights_a_call_waits_on_are_held_once_in_their_engines_segment(tmp_path):
    module = ReadsInACall()
    tf.saved_model.save(module, str(tmp_path), signatures=module.serve)
    converter = trt.TrtGraphConverterV2(input_saved_model_dir=str(tmp_path))
    func = converter.convert()
    graph_def = converter._converted_graph_def
    assert [n.name for n in graph_def.node if n.op == "Const"
            and n.attr["value"].tensor.ByteSize() >= LARGE_CONST_BYTES] == []
    segment, = graph_def.library.function
    assert sum(n.op == "Const" and n.attr["value"].tensor.ByteSize() >= LARGE_CONST_BYTES
               for n in segment.node_def) == 12
    x = tf.constant(random_array([3, 128]))
    want, got = module.serve(x), func(x=x)
    for key in want:
        np.testing.assert_allclose(got[key].numpy(), want[key].numpy(), rtol=1e-5, atol=1e-5)


# -- Keras models whose grouped convolutions are XLA-compiled calls convert to one engine ------------------
def grouped_block(x, filters, groups, stride=1):
    """A RegNetX-style block: 1x1 conv, grouped 3x3 conv, 1x1 conv (batch norms), residual, relu."""
    import keras

    shortcut = x
    if stride != 1 or x.shape[-1] != filters:
        shortcut = keras.layers.Conv2D(filters, 1, strides=stride)(x)
    for kernel, s, g, act in ((1, 1, 1, "relu"), (3, stride, groups, "relu"), (1, 1, 1, None)):
        x = keras.layers.Conv2D(filters, kernel, strides=s, groups=g, padding="same", use_bias=False)(x)
        x = keras.layers.BatchNormalization()(x)
        x = keras.layers.Activation(act)(x) if act else x
    return keras.layers.ReLU()(keras.layers.Add()([x, shortcut]))


def grouped_conv_model():
    import keras

    inp = keras.Input((16, 16, 4))
    x = keras.layers.Conv2D(8, 3, groups=2, padding="same", activation="relu")(inp)
    return keras.Model(inp, keras.layers.Conv2D(6, 1)(x))


def regnet_like_model():
    import keras

    inp = keras.Input((32, 32, 3))
    x = keras.layers.Conv2D(16, 3, strides=2, padding="same", activation="relu")(inp)
    for filters, groups, stride in ((16, 2, 1), (32, 4, 2), (32, 4, 1)):
        x = grouped_block(x, filters, groups, stride)
    x = keras.layers.GlobalAveragePooling2D()(x)
    return keras.Model(inp, keras.layers.Dense(10)(x))


def convnext_tiny():
    import keras

    return keras.applications.ConvNeXtTiny(weights=None, input_shape=(32, 32, 3))


def exported(build, path):
    import keras

    keras.utils.set_random_seed(0)
    build().export(str(path), verbose=False)
    return str(path)


def assert_one_engine_matching_tf(model_dir, atol):
    converter = trt.TrtGraphConverterV2(input_saved_model_dir=model_dir)
    func = converter.convert()
    graph_def = converter._converted_graph_def
    assert not call_ops(graph_def)
    feeds = weight_feeds(graph_def)  # reads of large variables giving the engine its weights
    assert [n.op for n in graph_def.node
            if n.op not in ("Placeholder", "Const", "Identity") and n.name not in feeds] == ["TRTEngineOp"], \
        converter._report.format()
    native = tf.saved_model.load(model_dir).signatures["serving_default"]
    (key, spec), = native.structured_input_signature[1].items()
    x = tf.constant(random_array([2] + spec.shape.as_list()[1:]))
    want, got = native(**{key: x}), func(**{key: x})
    for out in want:
        np.testing.assert_allclose(got[out].numpy(), want[out].numpy(), rtol=atol, atol=atol)


@pytest.mark.parametrize("build", [grouped_conv_model, regnet_like_model])
def test_keras_grouped_convolutions_convert_to_one_engine(tmp_path, build):
    assert_one_engine_matching_tf(exported(build, tmp_path / "model"), atol=1e-4)


@pytest.mark.slow
def test_convnext_tiny_converts_to_one_engine(tmp_path):
    assert_one_engine_matching_tf(exported(convnext_tiny, tmp_path / "model"), atol=1e-4)


# -- loops stay native, the ops around them convert -----------------------------------------------------
class Looping(tf.Module):
    """matmul+relu chain -> tf.while_loop (a tanh(matmul) step per row of the batch: a trip count known only when
    it runs, so the loop is not unrolled) -> matmul+relu chain."""

    def __init__(self):
        self.w = tf.Variable(random_array([4, 4]) / 2)

    @tf.function(input_signature=[tf.TensorSpec([None, 4], tf.float32)])
    def serve(self, x):
        y = tf.nn.relu(tf.matmul(x, self.w) + 1.0)
        _, y = tf.while_loop(lambda i, y: i < tf.shape(y)[0], lambda i, y: (i + 1, tf.tanh(tf.matmul(y, self.w))),
                             [tf.constant(0), y])
        return {"out": tf.nn.relu(tf.matmul(y, self.w) * 2.0)}


def assert_saved_and_loaded_matches(converter, model_dir, tmp_path, x):
    """The converted SavedModel, saved and loaded, gives what `model_dir`'s signature gives."""
    converter.save(str(tmp_path / "converted"))
    loaded = tf.saved_model.load(str(tmp_path / "converted")).signatures["serving_default"]
    native = tf.saved_model.load(model_dir).signatures["serving_default"]
    (key, _), = native.structured_input_signature[1].items()
    want, got = native(**{key: tf.constant(x)}), loaded(**{key: tf.constant(x)})
    for out in want:
        np.testing.assert_allclose(got[out].numpy(), want[out].numpy(), rtol=1e-5, atol=1e-5)


def test_a_while_loop_stays_native_between_engines_and_survives_save_and_load(tmp_path):
    module = Looping()
    tf.saved_model.save(module, str(tmp_path / "model"), signatures={"serving_default": module.serve})
    converter = trt.TrtGraphConverterV2(input_saved_model_dir=str(tmp_path / "model"))
    func = converter.convert()
    ops = [n.op for n in converter._converted_graph_def.node]
    assert ops.count("TRTEngineOp") == 2 and ops.count("While") == 1
    assert converter._report.reasons("While") == {FUNCTIONAL_OPS["While"]: 1}
    x = random_array([3, 4])
    want = module.serve(tf.constant(x))["out"].numpy()
    np.testing.assert_allclose(func(x=tf.constant(x))["out"].numpy(), want, rtol=1e-5, atol=1e-5)
    assert_saved_and_loaded_matches(converter, str(tmp_path / "model"), tmp_path, x)


def lowering_marks(graph_def):
    """{(function name or "", node name): the node's runtime lowering mark} of its control flow ops."""
    return {(fn, node.name): node.attr[graph_io.LOWERING_ATTR].b
            for fn, node in graph_io._control_flow_nodes(graph_def)}


def test_a_frozen_loop_stays_one_node_that_tensorflow_still_lowers_when_it_runs(tmp_path):
    """Freezing without lowering marks loops not to be lowered at run time either, and a While run as a function
    call per iteration is several times slower: the converted graph and the saved model keep TF's lowering."""
    module = Looping()
    tf.saved_model.save(module, str(tmp_path / "model"), signatures={"serving_default": module.serve})
    converter = trt.TrtGraphConverterV2(input_saved_model_dir=str(tmp_path / "model"))
    converter.convert()
    marks = lowering_marks(converter._converted_graph_def)
    assert marks and all(marks.values())
    converter.save(str(tmp_path / "converted"))
    saved = saved_model_pb2.SavedModel.FromString((tmp_path / "converted" / "saved_model.pb").read_bytes())
    marks = lowering_marks(saved.meta_graphs[0].graph_def)
    assert marks and all(marks.values())


def test_control_flow_the_original_kept_functional_stays_functional_by_name():
    """An op the original marked not to lower (an XLA cluster's) keeps that mark; ops marked to lower get theirs
    back; where the original marked none functional, every frozen control flow op is lowered."""
    def graph(marks):
        g = graph_pb2.GraphDef()
        for name, mark in marks.items():
            node = g.node.add(name=name, op="While")
            if mark is not None:
                node.attr[graph_io.LOWERING_ATTR].b = mark
        return g

    original = graph({"xla/while": False, "loop": True})
    frozen = graph({"xla/while": False, "loop": False, "renamed/loop": False})
    assert graph_io.keep_runtime_lowering(frozen, original) == 1
    assert lowering_marks(frozen) == {("", "xla/while"): False, ("", "loop"): True, ("", "renamed/loop"): False}
    frozen = graph({"a": False, "b": False})
    assert graph_io.keep_runtime_lowering(frozen, graph({"c": True})) == 2
    assert all(lowering_marks(frozen).values())


def test_a_keras_lstm_of_a_fixed_length_converts_into_one_engine_and_matches_after_save_and_load(tmp_path):
    import keras

    def build():
        inp = keras.Input((5, 4))
        x = keras.layers.Dense(8, activation="relu")(inp)
        x = keras.layers.LSTM(6)(x)
        return keras.Model(inp, keras.layers.Dense(3)(x))

    model_dir = exported(build, tmp_path / "model")
    converter = trt.TrtGraphConverterV2(input_saved_model_dir=model_dir)
    converter.convert()
    ops = [n.op for n in converter._converted_graph_def.node]
    assert ops.count("TRTEngineOp") == 1 and not {"While", "StatelessWhile"} & set(ops)  # unrolled
    assert_saved_and_loaded_matches(converter, model_dir, tmp_path, random_array([2, 5, 4]))


def lowered_loop(x):
    """What a TF1 graph holds: the loop lowered to Enter/Merge/Switch/NextIteration/Exit frames."""
    y = tf.nn.relu(tf.matmul(x, W) + 1.0)
    _, y = tf.while_loop(lambda i, y: i < 3, lambda i, y: (i + 1, tf.tanh(tf.matmul(y, W))), [tf.constant(0), y])
    return tf.nn.relu(tf.matmul(y, W) * 2.0)


def tf1_functional_loop():
    """A TF1 graph built in graph mode: the loop is one While node."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None, 4], name="x")
        tf.identity(lowered_loop(x), name="out")
    return graph.as_graph_def(), "x:0", "out"


def tf1_lowered_loop():
    graph_def, (x,), (y,) = frozen_graph_def(lowered_loop, [tf.TensorSpec([None, 4], tf.float32)])
    assert {"Enter", "Exit", "NextIteration"} <= {n.op for n in graph_def.node}
    return graph_def, f"{x}:0", y.split(":")[0]


@pytest.mark.parametrize("make, engines", [(tf1_lowered_loop, 2), (tf1_functional_loop, 1)])
def test_a_tf1_graph_with_a_while_loop_converts_through_trt_graph_converter(make, engines):
    """A lowered loop (TF1 frames) stays native between two engines; a functional one of 3 steps is unrolled into
    the one engine around it."""
    graph_def, x_name, out = make()
    with tf.Graph().as_default():
        converted = trt.TrtGraphConverter(input_graph_def=graph_def, nodes_denylist=[out]).convert()
    assert sum(n.op == "TRTEngineOp" for n in converted.node) == engines
    x = random_array([3, 4])
    want = run_graph_def(graph_def, {x_name: x}, [f"{out}:0"])[0]
    got = run_graph_def(converted, {x_name: x}, [f"{out}:0"])[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_lowered_loop_nodes_say_why_they_stay_native():
    graph_def, _, out = tf1_lowered_loop()
    with tf.Graph().as_default():
        converter = trt.TrtGraphConverter(input_graph_def=graph_def, nodes_denylist=[out])
        converter.convert()
    reasons = converter._report.reasons
    for op in ("Enter", "Merge", "Switch", "NextIteration", "Exit", "LoopCond", "Tanh"):
        assert set(reasons(op)) == {LOOP_REASON}, (op, reasons(op))


# -- load_signature: a damaged saved_model.pb ----------------------------------------------------------------
def damaged_copy(src, dst, edit):
    """A copy of SavedModel `src` at `dst` whose saved_model.pb bytes went through `edit`."""
    shutil.copytree(src, dst)
    pb = os.path.join(dst, "saved_model.pb")
    with open(pb, "rb") as f:
        data = edit(bytearray(f.read()))
    with open(pb, "wb") as f:
        f.write(bytes(data))
    return str(dst)


def flipped(offset):
    def edit(data):
        data[offset % len(data)] ^= 0xFF
        return data
    return edit


def edited_proto(change):
    def edit(data):
        proto = saved_model_pb2.SavedModel.FromString(bytes(data))
        change(proto)
        return proto.SerializeToString()
    return edit


def test_a_saved_model_pb_with_flipped_bits_loads_or_raises_saved_model_error_in_one_line(saved_model, tmp_path):
    src = saved_model("small_cnn")
    size = os.path.getsize(os.path.join(src, "saved_model.pb"))
    refused = 0
    for i, offset in enumerate(list(range(0, 64, 7)) + [size * k // 29 for k in range(1, 29)] + [size - 1]):
        model_dir = damaged_copy(src, tmp_path / str(i), flipped(offset))
        try:
            graph_io.load_signature(model_dir, ["serve"], "serving_default")
        except graph_io.SavedModelError as exc:  # anything else fails the test
            assert "\n" not in str(exc) and str(exc).startswith(f"cannot load SavedModel {model_dir!r}"), offset
            refused += 1
    assert refused >= 25  # most bytes matter; a flipped byte of a name or a doc string may load


def _misname_an_input(proto):
    meta = proto.meta_graphs[0]
    fdef = next(f for f in meta.graph_def.library.function
                if len(f.node_def) > 2 and f.signature.name in meta.object_graph_def.concrete_functions)
    node = next(n for n in fdef.node_def if n.input)
    node.input[0] = "no_such_node"


def _dangle_a_child(proto):
    proto.meta_graphs[0].object_graph_def.nodes[0].children[0].node_id = 10 ** 6


@pytest.mark.parametrize("change, cause", [
    (_misname_an_input, "its saved_model.pb is malformed (KeyError: 'no_such_node')"),
    (_dangle_a_child, "its saved_model.pb is malformed (IndexError: list index out of range)"),
], ids=["misnamed function input", "dangling object reference"])
def test_a_malformed_saved_model_pb_names_the_cause_and_the_damage(saved_model, tmp_path, change, cause):
    """Errors TensorFlow's loader raises by accident (KeyError, IndexError) are SavedModelErrors too; the
    checksum TensorFlow keeps in fingerprint.pb tells that the file changed after it was written."""
    model_dir = damaged_copy(saved_model("small_cnn"), tmp_path / "m", edited_proto(change))
    with pytest.raises(graph_io.SavedModelError) as info:
        graph_io.load_signature(model_dir, ["serve"], "serving_default")
    assert str(info.value) == (
        f"cannot load SavedModel {model_dir!r} with tags ['serve']: {cause}; saved_model.pb does not match the "
        "checksum in its fingerprint.pb, so the file is damaged: restore or re-export the SavedModel")


def test_an_unparsable_saved_model_pb_is_one_line_without_the_checksum_claim(saved_model, tmp_path):
    model_dir = damaged_copy(saved_model("small_cnn"), tmp_path / "m", lambda data: data[:len(data) // 2])
    with pytest.raises(graph_io.SavedModelError, match=r"^cannot load SavedModel .* Cannot parse file .*"
                                                       r"saved_model.pb.: Error parsing message") as info:
        graph_io.load_signature(model_dir, ["serve"], "serving_default")
    assert "\n" not in str(info.value) and "fingerprint" not in str(info.value)


def test_functions_first_called_with_grappler_off_leave_the_process_setting_as_it_was():
    options = tf.config.optimizer.get_experimental_options
    before = options().get("disable_meta_optimizer", False)
    with graph_io.grappler_off():
        assert options()["disable_meta_optimizer"] is True
        assert float(tf.function(lambda x: x * 2.0)(tf.constant(1.5))) == 3.0
    assert options().get("disable_meta_optimizer", False) == before
