"""Shape computations stay with their consumer: a value a converter needs known when building (Reshape's shape,
Tile's multiples) is copied into every segment that reads it, so it never crosses a segment border."""
import keras
import numpy as np
import pytest
import tensorflow as tf

from seg_graphs import assert_acyclic, graph_def, native, placeholder
from support import random_array
from tftrt_py import trt_convert as trt
from tftrt_py.segmenter import segment_graph
from tftrt_py.segmenter.candidates import OP_DENYLIST_ENV
from tftrt_py.segmenter.segment import build_segment


def shared_shape_graph():
    """One batch size read by Reshapes on both sides of a native op: one engine feeds the op, one waits for it."""
    def build():
        x = placeholder("x", (None, 8))
        a = tf.nn.relu(x, name="a")
        batch = tf.strided_slice(tf.shape(a, name="shape"), [0], [1], shrink_axis_mask=1, name="batch")
        dims = tf.stack([batch, -1, 4], name="dims")
        r1 = tf.reshape(a, dims, name="r1")
        tf.reshape(tf.tanh(native(r1, "n"), name="t"), dims, name="r2")

    return graph_def(build)


def test_a_shape_computation_is_copied_into_each_segment_that_reads_it():
    result = segment_graph(shared_shape_graph(), minimum_segment_size=1, fetches=["r2"])
    first, second = result.segments
    assert first.nodes == ["a", "r1"] and second.nodes == ["t", "r2"]
    for seg in result.segments:
        assert {"shape", "batch", "dims"} <= set(seg.copied_nodes)
        assert seg.static_inputs_outside(result.view) == []
    assert second.inputs == ["n:0", "a:0"]  # a: the tensor whose shape the copied Shape reads
    assert_acyclic(result)


def test_a_copied_shape_computation_read_only_by_engines_counts_as_converted():
    report = segment_graph(shared_shape_graph(), minimum_segment_size=1, fetches=["r2"]).report
    assert not {"shape", "batch", "dims"} & set(report.node_reasons)


def test_a_shape_computation_read_by_a_native_op_stays_in_the_graph_too():
    def build():
        x = placeholder("x", (None, 8))
        dims = tf.stack([tf.shape(x, name="shape")[0], -1, 4], name="dims")
        tf.reshape(tf.nn.relu(x, name="a"), dims, name="r")
        native(dims, "n")

    result = segment_graph(graph_def(build), minimum_segment_size=1)
    (seg,) = result.segments
    assert "dims" in seg.copied_nodes
    assert result.report.node_reasons["dims"][1].startswith("known when building, read outside the engines")


def test_a_segment_fed_its_reshape_target_at_run_time_is_refused():
    """The invariant check: without the copies the Reshape's target would arrive at run time."""
    gd = shared_shape_graph()
    result = segment_graph(gd, minimum_segment_size=1)
    consts = {n.name for n in result.view.nodes.values() if n.op == "Const"}
    seg = build_segment(result.view, 0, ["t", "r2"], consts, set())
    assert seg.static_inputs_outside(result.view) == ["r2:1"]


# -- end to end: convert, build, serve with no native fallback ---------------------------------------------
def reshape_across(a):
    x = tf.nn.relu(a * 2.0)
    y = tf.tanh(tf.math.cumsum(x, axis=1))
    return tf.reshape(y, [tf.shape(x)[0], -1, 4]) + 1.0


def repeat(a):
    x = tf.math.cumsum(tf.nn.relu(a), axis=1)
    return tf.repeat(tf.tanh(x), 2, axis=1) * 3.0


class UpSampling(tf.Module):
    def __init__(self):
        self.up = keras.layers.UpSampling2D()

    def __call__(self, a):
        return tf.tanh(self.up(tf.math.cumsum(tf.nn.relu(a), axis=1))) * 2.0


class ClassToken(tf.Module):
    def __init__(self):
        self.token = tf.Variable(random_array((1, 1, 8)))

    def __call__(self, a):
        x = tf.math.cumsum(tf.nn.relu(a), axis=1)
        tokens = tf.tile(self.token, [tf.shape(x)[0], 1, 1])
        return tf.nn.relu(tf.concat([tokens, x * 2.0], axis=1))


CASES = {
    "reshape_across_a_native_op": (reshape_across, (3, 8)),
    "tf_repeat": (repeat, (2, 4, 3)),
    "keras_upsampling2d": (UpSampling(), (2, 4, 4, 3)),
    "class_token_concat": (ClassToken(), (2, 5, 8)),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_shape_computations_serve_in_engines_with_no_native_fallback(name, tmp_path, monkeypatch):
    monkeypatch.setenv(OP_DENYLIST_ENV, "Cumsum")  # the op between the clusters stays native whatever converts
    fn, shape = CASES[name]
    module = fn if isinstance(fn, tf.Module) else tf.Module()
    module.serve = tf.function(fn.__call__ if isinstance(fn, tf.Module) else fn,
                               input_signature=[tf.TensorSpec((None,) + shape[1:])])
    tf.saved_model.save(module, str(tmp_path), signatures=module.serve)
    converter = trt.TrtGraphConverterV2(input_saved_model_dir=str(tmp_path))
    func = converter.convert()
    x = random_array(shape)
    converter.build(input_fn=lambda: iter([(x,)]))
    (got,) = func(tf.constant(x)).values()
    original = tf.saved_model.load(str(tmp_path))
    want = original.serve(tf.constant(x))
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5, atol=1e-5)
    engines = [n.name for n in converter._converted_graph_def.node if n.op == "TRTEngineOp"]
    stats = trt.engine_op_stats()
    assert engines and all(stats[e]["fallback_total"] == 0 and stats[e]["build_failures"] == 0 for e in engines)
