"""GraphView.topological_order: deterministic, leaves out a lowered loop's NextIteration -> Merge back edge,
and still refuses real cycles."""
import pytest
import tensorflow as tf
from tensorflow.core.framework import graph_pb2

from support import frozen_graph_def
from tftrt_py.convert.graph import GraphView, split_ref


def lowered_loop_view():
    fn = lambda x: tf.while_loop(lambda i, y: i < 3, lambda i, y: (i + 1, tf.tanh(y)), [tf.constant(0), x])[1]
    graph_def, _, _ = frozen_graph_def(fn, [tf.TensorSpec([2], tf.float32)])
    return GraphView(graph_def)


def test_a_lowered_loop_is_ordered_with_only_its_back_edges_left_out():
    view = lowered_loop_view()
    order = [n.name for n in view.topological_order()]
    assert sorted(order) == sorted(view.nodes)
    position = {name: i for i, name in enumerate(order)}
    back_edges = 0
    for node in view.nodes.values():
        for producer in [split_ref(r)[0] for r in node.inputs] + node.control_inputs:
            if position[producer] > position[node.name]:
                assert (view.nodes[producer].op, node.op) == ("NextIteration", "Merge")
                back_edges += 1
    assert back_edges == sum(n.op == "NextIteration" for n in view.nodes.values()) > 0


def test_a_real_cycle_still_raises():
    graph_def = graph_pb2.GraphDef()
    graph_def.node.add(name="a", op="Identity", input=["b"])
    graph_def.node.add(name="b", op="Identity", input=["a"])
    with pytest.raises(ValueError, match="graph has a cycle"):
        GraphView(graph_def).topological_order()
