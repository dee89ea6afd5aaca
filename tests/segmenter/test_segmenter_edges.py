"""Consts are copied into segments; control edges crossing a segment move to the engine node, but a fetched
pass-through waiting on native nodes stays outside the engines."""
import tensorflow as tf

from seg_graphs import assert_acyclic, graph_def, members, native, placeholder, relu_chain
from tftrt_py.segmenter import segment_graph
from tftrt_py.segmenter.segmentation import WAITING_FETCH


def test_consts_are_copied_in_never_inputs():
    def build():
        x = placeholder("x")
        c = tf.constant(2.0, name="c")
        relu_chain(tf.multiply(tf.add(x, c, name="add"), c, name="mul"), ["r"])

    (seg,) = segment_graph(graph_def(build)).segments
    assert seg.nodes == ["add", "mul", "r"]
    assert seg.inputs == ["x:0"]
    assert seg.copied_nodes == ["c"]


def test_a_const_is_never_an_output_even_when_fetched():
    def build():
        x = placeholder("x")
        c = tf.constant(2.0, name="c")
        relu_chain(tf.add(x, c, name="add"), ["r1", "r2"])
        native(c, "n")

    result = segment_graph(graph_def(build), fetches=["c:0", "r2:0"])
    (seg,) = result.segments
    assert seg.outputs == ["r2:0"]
    assert seg.copied_nodes == ["c"]
    assert "c" in result.report.node_reasons


def test_a_const_read_only_by_engines_counts_as_converted():
    def build():
        x = placeholder("x")
        relu_chain(tf.add(x, tf.constant(2.0, name="c"), name="add"), ["r1", "r2"])

    report = segment_graph(graph_def(build)).report
    assert (report.total_nodes, report.converted_nodes) == (5, 4)
    assert list(report.node_reasons) == ["x"]


def test_control_input_from_outside_moves_to_the_segment():
    def build():
        x = placeholder("x")
        side = native(placeholder("y"), "side")
        r1 = tf.nn.relu(x, name="r1")
        with tf.control_dependencies([side]):
            r2 = tf.nn.relu(r1, name="r2")
        with tf.control_dependencies([r1]):  # between members: dropped
            tf.nn.relu(r2, name="r3")

    (seg,) = segment_graph(graph_def(build)).segments
    assert seg.nodes == ["r1", "r2", "r3"]
    assert seg.control_inputs == ["side"]
    assert seg.control_outputs == []


def _output_waiting_on_a_write():
    """r1 -> r2 -> out, where the fetched `out` waits (control edge) on a native node reading r1, as a tf.function's
    outputs wait on a variable write of a value it computed (a BatchNormalization updating its statistics)."""
    r1 = tf.nn.relu(placeholder("x"), name="r1")
    write = native(r1, "write")
    r2 = tf.nn.relu(r1, name="r2")
    with tf.control_dependencies([write]):
        tf.identity(r2, name="out")


def test_a_fetched_identity_waiting_on_a_native_node_stays_outside_and_splits_no_engine():
    result = segment_graph(graph_def(_output_waiting_on_a_write), minimum_segment_size=1, fetches=["out:0"])
    assert members(result) == [["r1", "r2"]]
    assert result.segments[0].control_inputs == [] and result.segments[0].outputs == ["r1:0", "r2:0"]
    assert result.report.node_reasons["out"] == ("Identity", WAITING_FETCH)
    assert_acyclic(result)


def test_an_identity_waiting_on_a_native_node_joins_its_engine_when_not_fetched():
    result = segment_graph(graph_def(_output_waiting_on_a_write), minimum_segment_size=1)
    assert members(result) == [["r1"], ["r2", "out"]]
    assert result.segments[1].control_inputs == ["write"]
    assert_acyclic(result)


def test_outside_node_waiting_on_a_member_is_a_control_output():
    def build():
        relu_chain(placeholder("x"), ["r1", "r2", "r3"])
        y, axis = placeholder("y"), tf.constant(0)
        with tf.control_dependencies([tf.compat.v1.get_default_graph().get_operation_by_name("r2")]):
            tf.raw_ops.Cumsum(x=y, axis=axis, name="after")

    (seg,) = segment_graph(graph_def(build)).segments
    assert seg.control_outputs == ["after"]
    assert seg.outputs == []


def test_control_inputs_of_copied_consts_move_to_the_segment():
    def build():
        x = placeholder("x")
        side = native(placeholder("y"), "side")
        with tf.control_dependencies([side]):
            c = tf.constant(1.0, name="c")
        relu_chain(tf.add(x, c, name="add"), ["r1", "r2"])

    (seg,) = segment_graph(graph_def(build)).segments
    assert seg.copied_nodes == ["c"]
    assert seg.control_inputs == ["side"]
