"""seg.graph_def(view) is a self-contained GraphDef that computes what the segment computes."""
import numpy as np
import tensorflow as tf

from seg_graphs import graph_def, native, placeholder
from support import frozen_graph_def, random_array
from tftrt_py.convert.build import build_engine
from tftrt_py.segmenter import segment_graph


def run(gd, fetches, feeds):
    graph = tf.Graph()
    with graph.as_default():
        tf.graph_util.import_graph_def(gd, name="")
    with tf.compat.v1.Session(graph=graph) as sess:
        return sess.run(fetches, feeds)


def two_in_two_out():
    def fn(x, y):
        a = tf.nn.relu(tf.raw_ops.Cumsum(x=x, axis=0))     # input 0 comes from a native op
        b = tf.multiply(a + 2.0, tf.sigmoid(y))           # Const 2.0 copied in
        c = tf.tanh(b) - y
        return tf.raw_ops.Cumsum(x=b, axis=1), c         # b read by a native op, c fetched

    return frozen_graph_def(fn, [tf.TensorSpec((None, 3), tf.float32), tf.TensorSpec((2, 3), tf.float32)])


def test_segment_graph_def_computes_what_the_original_subgraph_computes():
    gd, inputs, outputs = two_in_two_out()
    result = segment_graph(gd, fetches=outputs)
    (seg,) = result.segments
    assert len(seg.inputs) == 2 and len(seg.outputs) == 2 and seg.copied_nodes

    feeds = {f"{name}:0": random_array((2, 3)) for name in inputs}
    originals = run(gd, seg.inputs + seg.outputs, feeds)
    got = run(seg.graph_def(result.view), [f"TensorRTOutputPH_{i}:0" for i in range(len(seg.outputs))],
              {f"TensorRTInputPH_{i}:0": v for i, v in enumerate(originals[:len(seg.inputs)])})
    for want, have in zip(originals[len(seg.inputs):], got):
        np.testing.assert_allclose(have, want, rtol=1e-6)


def test_segment_graph_def_placeholders_carry_dtype_and_shape_and_drop_control_inputs():
    def build():
        x = placeholder("x", (None, 3))
        with tf.control_dependencies([native(placeholder("y"), "side")]):
            r = tf.nn.relu(x, name="r1")
        tf.nn.relu(tf.nn.relu(r, name="r2"), name="r3")

    result = segment_graph(graph_def(build), fetches=["r3"])
    (seg,) = result.segments
    nodes = {n.name: n for n in seg.graph_def(result.view).node}
    assert list(nodes) == ["TensorRTInputPH_0", "r1", "r2", "r3", "TensorRTOutputPH_0"]
    ph = nodes["TensorRTInputPH_0"]
    assert ph.op == "Placeholder" and ph.attr["dtype"].type == tf.float32.as_datatype_enum
    assert [d.size for d in ph.attr["shape"].shape.dim] == [-1, 3]
    assert list(nodes["r1"].input) == ["TensorRTInputPH_0"]
    assert list(nodes["TensorRTOutputPH_0"].input) == ["r3:0"]
    assert nodes["TensorRTOutputPH_0"].attr["T"].type == tf.float32.as_datatype_enum


def test_segment_graph_def_builds_an_engine_that_matches_tensorflow():
    gd, inputs, outputs = two_in_two_out()
    result = segment_graph(gd, fetches=outputs)
    (seg,) = result.segments
    feeds = {f"{name}:0": random_array((2, 3)) for name in inputs}
    originals = run(gd, seg.inputs + seg.outputs, feeds)
    engine = build_engine(seg.graph_def(result.view), [(2, 3)] * len(seg.inputs))
    got = engine.create_execution_context().execute_v2(originals[:len(seg.inputs)])
    for want, have in zip(originals[len(seg.inputs):], got):
        np.testing.assert_allclose(have, want, rtol=1e-5, atol=1e-6)
