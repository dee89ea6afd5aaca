"""Saving a conversion's kept variables as constants: a variable that one engine op alone reads, as a weight, becomes
a constant of that op's native segment (the op takes no input for it); one that two engine ops read stays a constant
of the weights function feeding both, saved once. The saved model serves as the original."""
import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.framework import function_def_to_graph

from tftrt_py import settings, trt_convert as trt
from tftrt_py.convert import segment_weights, variables
from tftrt_py.engine_op import dispatcher

WIDTH = 512  # a 1 MiB kernel: kept as a variable during the conversion
RNG = np.random.default_rng(7)


class TwoEngines(tf.Module):
    """x @ a -> a native Cumprod -> @ a again (`a` read by the engines on either side) -> @ b."""

    def __init__(self):
        self.a = tf.Variable(RNG.normal(0, 0.05, (WIDTH, WIDTH)).astype(np.float32))
        self.b = tf.Variable(RNG.normal(0, 0.05, (WIDTH, WIDTH)).astype(np.float32))

    @tf.function(input_signature=[tf.TensorSpec([None, WIDTH], tf.float32)])
    def serve(self, x):
        h = tf.nn.relu(tf.matmul(x, self.a))
        h = tf.math.cumprod(tf.sigmoid(h), axis=1)  # no converter: native, between two engines
        return {"y": tf.matmul(tf.nn.relu(tf.matmul(h, self.a)), self.b)}


@pytest.fixture(params=[False, True], ids=["static", "dynamic"])
def saved(request, tmp_path, monkeypatch):
    """(source, saved) directories of the model converted (static engines, or dynamic shapes) and saved."""
    monkeypatch.setenv(settings.KEEP_VARIABLES.name, str(1 << 30))  # saved as constants
    model = TwoEngines()
    src, out = str(tmp_path / "model"), str(tmp_path / "converted")
    tf.saved_model.save(model, src, signatures=model.serve)
    converter = trt.TrtGraphConverterV2(input_saved_model_dir=src, use_dynamic_shape=request.param)
    converter.convert()
    converter.build(input_fn=lambda: iter([(tf.ones([4, WIDTH]),)]))
    converter.save(out)
    return src, out, request.param


def library(path):
    graph = tf.saved_model.load(path).signatures["serving_default"].graph.as_graph_def()
    return {f.signature.name: f for f in graph.library.function}


def weight_bytes(fdef):
    return sorted(len(n.attr["value"].tensor.tensor_content) for n in fdef.node_def
                  if n.op == "Const" and len(n.attr["value"].tensor.tensor_content) >= WIDTH * WIDTH * 4)


def test_a_weight_one_engine_reads_alone_moves_into_its_segment_and_a_shared_one_stays_shared(saved):
    _, out, _ = saved
    functions = library(out)
    engines = [n for f in functions.values() for n in f.node_def if n.op == "TRTEngineOp"]
    assert len(engines) == 2
    segments = [functions[n.attr["segment_func"].func.name] for n in engines]
    assert sorted(len(weight_bytes(s)) for s in segments) == [0, 1]  # b: into the second engine's segment
    (shared,) = [f for name, f in functions.items() if variables.WEIGHTS_FUNCTION in name]
    assert weight_bytes(shared) == [WIDTH * WIDTH * 4]  # a: read by both engines, saved once
    assert sorted(len(variables.weight_inputs(n)) for n in engines) == [1, 1]
    for node, segment in zip(engines, segments):
        assert len(node.attr["InT"].list.type) == len(node.attr["input_shapes"].list.shape) == len(
            segment.signature.input_arg)


def builds():
    return sum(s["builds"] for s in dispatcher.stats().values())


def test_the_saved_model_serves_its_saved_engines_and_new_batches_as_the_original(saved, caplog):
    """The rewritten segments compute what the engines were built for: the saved engines keep serving (their
    binding digest is the rewritten op's), and a new batch builds from the segment's constants: beyond the static
    engine's batch, or outside the dynamic engine's profile (the built shape alone)."""
    src, out, dynamic = saved
    fell_back = {op: s["fallback_total"] for op, s in dispatcher.stats().items()}  # (other tests' live ops too)
    serve = tf.saved_model.load(out).signatures["serving_default"]
    want = tf.saved_model.load(src).signatures["serving_default"]
    for batch, built in ((4, False), (3, dynamic), (8, True)):  # built; served by it (static); beyond it
        x = tf.constant(RNG.normal(0, 1, (batch, WIDTH)).astype(np.float32))
        before = builds()
        np.testing.assert_allclose(serve(x)["y"].numpy(), want(x)["y"].numpy(), rtol=1e-4, atol=1e-5)
        assert (builds() > before) == built
    assert "ignoring engine" not in caplog.text
    served = {op: s for op, s in dispatcher.stats().items() if s["engine_runs"]}
    assert served and all(s["fallback_total"] == fell_back.get(op, 0) for op, s in served.items())


def test_a_keras_export_s_weights_move_and_its_engine_op_keeps_only_the_model_s_input(tmp_path, monkeypatch):
    import keras

    monkeypatch.setenv(settings.KEEP_VARIABLES.name, str(1 << 30))
    keras.utils.set_random_seed(3)
    model = keras.Sequential([keras.Input((WIDTH,)), keras.layers.Dense(WIDTH, activation="relu"),
                              keras.layers.Dense(WIDTH)])
    src, out = str(tmp_path / "model"), str(tmp_path / "converted")
    model.export(src, verbose=False)
    converter = trt.TrtGraphConverterV2(input_saved_model_dir=src)
    converter.convert()
    x = RNG.normal(0, 1, (4, WIDTH)).astype(np.float32)
    converter.build(input_fn=lambda: iter([(tf.constant(x),)]))
    converter.save(out)
    functions = library(out)
    (engine,) = [n for f in functions.values() for n in f.node_def if n.op == "TRTEngineOp"]
    assert len(engine.attr["InT"].list.type) == 1 and not variables.weight_inputs(engine)
    segment = engine.attr["segment_func"].func.name
    assert len(weight_bytes(functions[segment])) == 2
    assert segment_weights.WEIGHTS_SUFFIX in segment  # a name of its own: registered without digesting it
    (converted,) = [n for n in converter._converted_graph_def.node if n.op == "TRTEngineOp"]
    assert converted.attr["segment_func"].func.name + segment_weights.WEIGHTS_SUFFIX in segment
    before = builds()
    got = tf.saved_model.load(out).signatures["serving_default"](tf.constant(x))
    np.testing.assert_allclose(next(iter(got.values())).numpy(), model(x).numpy(), rtol=1e-4, atol=1e-5)
    assert builds() == before


def test_control_edges_from_a_read_do_not_keep_it_out_of_the_segment(tmp_path, monkeypatch):
    """keras-hub models end their serving function in a NoOp with a control edge from every variable read: the
    reads move all the same (a constant needs no ordering) and the edges go with them."""
    monkeypatch.setenv(settings.KEEP_VARIABLES.name, str(1 << 30))
    model = TwoEngines()
    src = str(tmp_path / "model")
    tf.saved_model.save(model, src, signatures=model.serve)
    converter = trt.TrtGraphConverterV2(input_saved_model_dir=src)
    converter.convert()
    graph = type(converter._converted_graph_def)()
    graph.CopyFrom(converter._converted_graph_def)
    reads = converter._variable_reads
    graph.node.add(name="closing", op="NoOp").input.extend(f"^{r}" for r in sorted(reads))
    moved, rewritten = segment_weights.reads_into_segments(graph, reads)
    assert len(moved) == 1 and len(rewritten) == 1  # b; a stays, read by both engines
    (closing,) = [n for n in graph.node if n.name == "closing"]
    assert sorted(closing.input) == sorted(f"^{r}" for r in reads if r not in moved)


def test_arguments_become_constants_in_one_pass_and_the_rest_keep_their_attributes_by_new_index():
    """Arguments 1 and 3 of four become Consts: nothing reads those arguments any more, the two left are
    renumbered 0 and 1 with their own attributes, and the function computes as before with the values given."""
    specs = [tf.TensorSpec([2], tf.float32, name=f"a{k}") for k in range(4)]

    @tf.function(input_signature=specs)
    def f(a0, a1, a2, a3):
        return a0 * a1 + a2, a3

    fdef = f.get_concrete_function().function_def
    names = [a.name for a in fdef.signature.input_arg]
    values = {1: np.array([2.0, 3.0], np.float32), 3: np.array([5.0, 7.0], np.float32)}
    segment_weights._args_to_consts(fdef, values)
    assert [a.name for a in fdef.signature.input_arg] == [names[0], names[2]]
    assert [fdef.arg_attr[k].attr["_user_specified_name"].s for k in (0, 1)] == [b"a0", b"a2"]
    assert not any(ref.split(":")[0] in (names[1], names[3]) for n in fdef.node_def for ref in n.input)
    body = function_def_to_graph.function_def_to_graph(fdef)
    a0, a2 = np.array([1.0, -1.0], np.float32), np.array([0.5, 0.25], np.float32)
    with tf.compat.v1.Session(graph=body) as session:
        product, passed = session.run([t.name for t in body.outputs],
                                      {body.inputs[0].name: a0, body.inputs[1].name: a2})
    np.testing.assert_array_equal(product, a0 * values[1] + a2)
    np.testing.assert_array_equal(passed, values[3])
