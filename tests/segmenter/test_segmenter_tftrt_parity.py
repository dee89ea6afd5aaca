"""Segments as TF-TRT forms them (segment.cc): clusters grown in reverse topological order, every node but
Identity, Snapshot and StopGradient counted, Consts included. Each expected engine below is worked out by hand
from TF-TRT's rule; ours may copy a Const into more engines, never convert fewer nodes."""
import numpy as np
import tensorflow as tf

from seg_graphs import assert_acyclic, graph_def, native, placeholder
from tftrt_py.segmenter import segment_graph


def engines(result):
    """Each segment's nodes, copies included, as TF-TRT would list its members."""
    return sorted((set(seg.nodes) | set(seg.copied_nodes) for seg in result.segments), key=sorted)


def assert_converts_at_least(result, expected):
    converted = set(result.view.nodes) - set(result.report.node_reasons)
    assert set().union(*expected) <= converted
    assert_acyclic(result)


def test_a_producer_read_around_an_unsupported_op_keeps_its_own_engine():
    # conv -> mul -> sub and conv -> u -> sub: visited from the outputs, mul joins sub first, then conv cannot
    # join them (conv -> u -> sub). TF-TRT: {weights, conv} and {bias, mul, sub}.
    def build():
        x = placeholder("x", (1, 4, 4, 3))
        conv = tf.nn.conv2d(x, tf.constant(np.ones((1, 1, 3, 3), np.float32), name="weights"), 1, "SAME",
                            name="conv")
        mul = tf.multiply(conv, tf.constant(2.0, name="bias"), name="mul")
        tf.subtract(mul, native(conv, "u"), name="sub")

    result = segment_graph(graph_def(build), minimum_segment_size=2)
    expected = [{"bias", "mul", "sub"}, {"conv", "weights"}]
    assert engines(result) == expected
    assert_converts_at_least(result, expected)


def test_a_const_operand_counts_towards_minimum_segment_size():
    def build():
        x = placeholder("x", (2, 3))
        tf.matmul(x, tf.constant(np.ones((3, 4), np.float32), name="ones"), name="matmul")

    result = segment_graph(graph_def(build), minimum_segment_size=2)
    assert engines(result) == [{"matmul", "ones"}] and result.segments[0].size == 2
    assert segment_graph(graph_def(build), minimum_segment_size=3).segments == []


def test_a_const_shared_by_two_branches_joins_them_into_one_engine():
    # TF-TRT contracts c's edges to both adds: one engine {c, a, b} of 3 nodes.
    def build():
        c = tf.constant(2.0, name="c")
        tf.add(placeholder("x"), c, name="a")
        tf.add(placeholder("y"), c, name="b")

    result = segment_graph(graph_def(build), minimum_segment_size=3)
    assert engines(result) == [{"a", "b", "c"}]


def adds(spec):
    """Adds named by `spec` (name -> its two operand names), over the placeholder "feed"."""
    def build():
        nodes = {"feed": placeholder("feed")}
        for name, (a, b) in spec.items():
            nodes[name] = tf.add(nodes[a], nodes[b], name=name)

    return graph_def(build)


def test_tftrt_avoid_cycle():
    # segment_test.cc AvoidCycle: add2 unsupported; add0 -> add2 -> add3 keeps add0 from add3: nothing of 2.
    graph = adds({"add0": ("feed", "feed"), "add1": ("feed", "feed"), "add2": ("add0", "add1"),
                  "add3": ("add0", "add2"), "add4": ("add2", "add2")})
    result = segment_graph(graph, minimum_segment_size=2, nodes_denylist=["add2"])
    assert engines(result) == []


def test_tftrt_multiple():
    # segment_test.cc Multiple: add5 unsupported splits two engines, one on each side of it.
    graph = adds({"add0": ("feed", "feed"), "add1": ("feed", "feed"), "add7": ("feed", "feed"),
                  "add2": ("add0", "add1"), "add3": ("add0", "add2"), "add5": ("add2", "add2"),
                  "add8": ("add7", "add7"), "add4": ("add5", "add8"), "add6": ("add7", "add8")})
    result = segment_graph(graph, minimum_segment_size=2, nodes_denylist=["add5"])
    expected = [{"add0", "add1", "add2", "add3"}, {"add4", "add6", "add7", "add8"}]
    assert engines(result) == expected
    assert_converts_at_least(result, expected)


def test_tftrt_big_if_else():
    # segment_test.cc BigIfElse: add2 unsupported. From the outputs, add3..add7 join; add0 cannot (add0 -> add1
    # -> add2 -> add3), so add0, add1 make the second engine.
    graph = adds({"add0": ("feed", "feed"), "add1": ("add0", "add0"), "add2": ("add1", "add1"),
                  "add3": ("add2", "add2"), "add4": ("add0", "add0"), "add5": ("add4", "add4"),
                  "add6": ("add5", "add5"), "add7": ("add3", "add6")})
    result = segment_graph(graph, minimum_segment_size=2, nodes_denylist=["add2"])
    expected = [{"add0", "add1"}, {"add3", "add4", "add5", "add6", "add7"}]
    assert engines(result) == expected
    assert_converts_at_least(result, expected)


def test_nodes_annotated_with_different_max_batch_sizes_stay_in_different_engines():
    # TF-TRT's ClusterBatchSize: two clusters merge only when their _tftrt_op_max_batch_size agree (or one has none).
    def build():
        x = placeholder("x", (2, 3))
        y = tf.nn.relu(tf.add(x, tf.constant(1.0, name="one"), name="add"), name="relu")
        tf.tanh(tf.multiply(y, tf.constant(3.0, name="three"), name="mul"), name="tanh")

    def annotated(caps):
        gd = graph_def(build)
        for node in gd.node:
            if node.name in caps:
                node.attr["_tftrt_op_max_batch_size"].i = caps[node.name]
        return gd

    split = segment_graph(annotated({"add": 4, "relu": 4, "mul": 2, "tanh": 2}), minimum_segment_size=2)
    assert engines(split) == [{"add", "one", "relu"}, {"mul", "tanh", "three"}]
    assert_acyclic(split)
    agreed = segment_graph(annotated({"add": 4, "tanh": 4}), minimum_segment_size=2)
    assert engines(agreed) == [{"add", "mul", "one", "relu", "tanh", "three"}]
