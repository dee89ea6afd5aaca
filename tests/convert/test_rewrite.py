"""Segments become TRTEngineOp nodes: attributes, native segment functions, rewired edges."""
import numpy as np
import tensorflow as tf

from seg_graphs import graph_def, native, placeholder, relu_chain
from tftrt_py.convert.graph import GraphView
from tftrt_py.convert.rewrite import EngineOpAttrs, rewrite
from tftrt_py.engine_op import library
from tftrt_py.segmenter import segment_graph


def convert(build, fetches, **attrs):
    library.load()
    gd = graph_def(build)
    view = GraphView(gd)
    result = segment_graph(view, fetches=fetches)
    return rewrite(gd, view, result.segments, EngineOpAttrs(**attrs), fetches=fetches, graph_index=0)


def nodes(gd):
    return {n.name: n for n in gd.node}


def test_engine_node_attributes_and_native_segment():
    def build():
        relu_chain(placeholder(), ["a", "b", "c"])

    out, fetch_map = convert(build, ["c:0"], precision_mode="FP16", max_cached_engines_count=7)
    engine = nodes(out)["TRTEngineOp_000_000"]
    assert fetch_map == {"c:0": "TRTEngineOp_000_000:0"}
    assert list(engine.input) == ["x:0"]
    assert engine.attr["precision_mode"].s == b"FP16" and engine.attr["max_cached_engines_count"].i == 7
    assert engine.attr["segment_func"].func.name == "TRTEngineOp_000_000_native_segment"
    assert [tf.as_dtype(t) for t in engine.attr["InT"].list.type] == [tf.float32]
    assert tf.TensorShape(engine.attr["output_shapes"].list.shape[0]).as_list() == [2, 3]
    assert engine.attr["serialized_segment"].s == b"" and len(engine.attr["segment_key"].s) == 32
    [fdef] = [f for f in out.library.function if f.signature.name == "TRTEngineOp_000_000_native_segment"]
    assert sorted(n.op for n in fdef.node_def) == ["Identity", "Relu", "Relu", "Relu"]
    assert not {"a", "b", "c"} & set(nodes(out))


def test_control_edges_move_to_the_engine_and_consumers_are_rewired():
    def build():
        x = placeholder()
        gate = tf.no_op(name="gate")
        with tf.control_dependencies([gate]):
            a = tf.nn.relu(x, name="a")
        c = relu_chain(a, ["b", "c"])
        n = native(c, "n")
        with tf.control_dependencies([c.op]):
            tf.identity(n, name="after")

    out, _ = convert(build, ["after:0"])
    g = nodes(out)
    assert "^gate" in g["TRTEngineOp_000_000"].input
    assert list(g["n"].input)[0] == "TRTEngineOp_000_000:0"
    assert "^TRTEngineOp_000_000" in g["after"].input


def test_constants_are_copied_in_and_dropped_when_unused():
    def build():
        x = placeholder()
        k = tf.constant(np.full((2, 3), 0.5, "float32"), name="k")
        relu_chain(x * k + k, ["r1", "r2"])

    out, _ = convert(build, ["r2:0"])
    assert "k" not in nodes(out)  # only the engine read it
    fdef = out.library.function[0]
    assert "k" in {n.name for n in fdef.node_def}
