"""Candidates joined by data edges form one segment, unless joining would close a cycle."""
import tensorflow as tf

from seg_graphs import assert_acyclic, graph_def, members, native, placeholder, relu_chain
from tftrt_py.segmenter import segment_graph


def test_supported_chain_is_one_segment_with_its_inputs_and_outputs():
    def build():
        x = placeholder("x")
        y = tf.tanh(tf.sigmoid(tf.nn.relu(x, name="r"), name="s"), name="t")
        native(y, "n")

    result = segment_graph(graph_def(build))
    (seg,) = result.segments
    assert (seg.name_index, seg.nodes, seg.size) == (0, ["r", "s", "t"], 3)
    assert seg.inputs == ["x:0"]
    assert seg.outputs == ["t:0"]
    assert seg.copied_nodes == [] and seg.control_inputs == [] and seg.control_outputs == []


def test_fetched_member_tensors_are_outputs_even_if_nothing_reads_them():
    def build():
        relu_chain(placeholder("x"), ["r1", "r2", "r3"])

    assert segment_graph(graph_def(build)).segments[0].outputs == []
    result = segment_graph(graph_def(build), fetches=["r3:0", "r1"])
    assert result.segments[0].outputs == ["r1:0", "r3:0"]


def test_unsupported_op_splits_two_regions_into_two_segments():
    def build():
        y = relu_chain(placeholder("x"), ["a1", "a2", "a3"])
        relu_chain(native(y, "n"), ["b1", "b2", "b3"])

    result = segment_graph(graph_def(build))
    assert members(result) == [["a1", "a2", "a3"], ["b1", "b2", "b3"]]
    assert [s.name_index for s in result.segments] == [0, 1]
    assert result.segments[0].outputs == ["a3:0"]
    assert result.segments[1].inputs == ["n:0"]


def test_diamond_through_a_native_op_stays_two_segments():
    # a3 feeds b1 directly and through n: one engine would both feed n and wait for it.
    def build():
        a = relu_chain(placeholder("x"), ["a1", "a2", "a3"])
        b = tf.add(a, native(a, "n"), name="b1")
        relu_chain(b, ["b2", "b3"])

    result = segment_graph(graph_def(build))
    assert members(result) == [["a1", "a2", "a3"], ["b1", "b2", "b3"]]
    assert result.segments[1].inputs == ["a3:0", "n:0"]
    assert_acyclic(result)


def test_regions_feeding_each_other_through_native_ops_in_both_directions_do_not_form_a_cycle():
    # p-side -> n1 -> q-side and q-side -> n2 -> p-side: one p-engine and one q-engine would deadlock.
    def build():
        x = placeholder("x")
        p1, q1 = tf.nn.relu(x, name="p1"), tf.nn.relu(x, name="q1")
        p2 = tf.add(p1, native(q1, "n2"), name="p2")
        q2 = tf.add(q1, native(p1, "n1"), name="q2")
        tf.nn.relu(p2, name="p3"), tf.nn.relu(q2, name="q3")

    result = segment_graph(graph_def(build), minimum_segment_size=1)
    assert_acyclic(result)
    # Clusters grow from the outputs (as TF-TRT's): q1 joins q2 before p1 is visited, then p1 -> n1 -> q-side
    # -> n2 -> p2 keeps p1 from p2.
    assert members(result) == [["p1"], ["q1", "q2", "q3"], ["p2", "p3"]]


def test_a_control_edge_through_a_native_op_also_blocks_a_merge():
    def build():
        r1 = tf.nn.relu(placeholder("x"), name="r1")
        r2 = tf.nn.relu(r1, name="r2")
        with tf.control_dependencies([native(r1, "n")]):
            tf.nn.relu(r2, name="r3")

    result = segment_graph(graph_def(build), minimum_segment_size=1)
    assert members(result) == [["r1"], ["r2", "r3"]]
    assert result.segments[0].control_outputs == []
    assert result.segments[1].control_inputs == ["n"]
    assert_acyclic(result)


def test_segments_and_their_order_are_deterministic():
    def build():
        x = placeholder("x")
        for i in range(4):
            x = native(relu_chain(x, [f"r{i}_{j}" for j in range(3)]), f"n{i}")

    gd = graph_def(build)
    first, second = segment_graph(gd), segment_graph(gd)
    assert first.segments == second.segments
    assert [seg.nodes[0] for seg in first.segments] == ["r0_0", "r1_0", "r2_0", "r3_0"]
