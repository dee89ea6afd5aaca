"""GraphView.topological_order: deterministic, leaves out a lowered loop's NextIteration -> Merge back edge,
and still refuses real cycles. A Const's size in bytes is read from its dtype and shape."""
import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.framework import graph_pb2

from support import frozen_graph_def
from tftrt_py.convert.graph import GraphView, const_nbytes, split_ref


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


def const_node(tensor):
    node = tf.compat.v1.NodeDef(name="c", op="Const")
    node.attr["value"].tensor.CopyFrom(tensor)
    return node


@pytest.mark.parametrize("value", [np.ones((128, 129), np.float32), np.arange(12, dtype=np.int8).reshape(3, 4),
                                   np.ones((7,), np.float16), np.float64(2.5)])
def test_a_constant_s_bytes_are_its_elements_times_its_dtype_s_size(value):
    assert const_nbytes(const_node(tf.make_tensor_proto(value))) == np.asarray(value).nbytes


def test_a_constant_of_one_repeated_value_counts_every_element():
    tensor = tf.make_tensor_proto(0.5, shape=[64, 1024])  # one float_val for 65,536 elements
    assert const_nbytes(const_node(tensor)) == 64 * 1024 * 4


def test_strings_count_by_their_serialized_size():
    tensor = tf.make_tensor_proto(np.array([b"a" * 100, b"b" * 50]))
    assert const_nbytes(const_node(tensor)) == tensor.ByteSize()
