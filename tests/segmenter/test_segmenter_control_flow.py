"""Control flow stays native with an explicit reason: lowered loop frames (Enter ... Exit) and conditional
branches (Switch ... Merge) of TF1 graphs, and functional While/If ops; the ops around them still convert."""
import tensorflow as tf

from reasons import segmentation
from seg_graphs import graph_def, placeholder
from tftrt_py.segmenter import segment_graph
from tftrt_py.segmenter.control_flow import COND_REASON, FUNCTIONAL_OPS, LOOP_REASON

SPEC = [tf.TensorSpec([2, 3], tf.float32)]
LOOP_OPS = ("Enter", "Merge", "Switch", "NextIteration", "Exit", "LoopCond")


def loop(x):
    return tf.while_loop(lambda i, y: i < 3, lambda i, y: (i + 1, tf.tanh(y) * 2.0), [tf.constant(0), x])[1]


def cond(x):
    return tf.cond(tf.reduce_sum(x) > 0, lambda: tf.tanh(x) * 2.0, lambda: tf.sigmoid(x) + 1.0)


def reasons_by_name(result):
    return {name: reason for name, (_, reason) in result.report.node_reasons.items()}


def ops_with(result, reason):
    return {op for op, r in result.report.node_reasons.values() if r == reason}


def converted_ops(result):
    return {result.view.nodes[name].op for seg in result.segments for name in seg.nodes}


def test_lowered_loop_nodes_stay_native_and_the_ops_around_convert():
    result = segmentation(lambda x: tf.nn.relu(loop(tf.nn.relu(x) + 1.0)) * 3.0, SPEC)
    assert set(LOOP_OPS) | {"Tanh", "Mul", "Less", "AddV2"} <= ops_with(result, LOOP_REASON)
    assert {"Relu", "AddV2", "Mul"} <= converted_ops(result)
    assert not any(result.view.nodes[n].op in LOOP_OPS for seg in result.segments for n in seg.nodes)


def test_lowered_cond_branches_stay_native_and_what_follows_the_merge_converts():
    result = segmentation(lambda x: tf.nn.relu(cond(x)) * 3.0, SPEC)
    assert {"Switch", "Merge", "Tanh", "Sigmoid"} <= ops_with(result, COND_REASON)
    assert {"Relu", "Mul"} <= converted_ops(result)


def test_control_flow_nested_in_a_loop_is_the_loop_s():
    result = segmentation(lambda x: tf.while_loop(lambda i, y: i < 2, lambda i, y: (i + 1, cond(y)),
                                                  [tf.constant(0), x])[1] * 2.0, SPEC)
    assert {"Tanh", "Sigmoid", "Switch", "Merge"} <= ops_with(result, LOOP_REASON)
    assert not ops_with(result, COND_REASON)
    assert "Mul" in converted_ops(result)


def test_a_loop_inside_a_cond_branch_is_a_loop_and_the_cond_closes_at_its_merge():
    result = segmentation(lambda x: tf.nn.relu(tf.cond(tf.reduce_sum(x) > 0, lambda: loop(x), lambda: x * 2.0)),
                          SPEC)
    assert "Tanh" in ops_with(result, LOOP_REASON) and "Mul" in ops_with(result, COND_REASON)
    assert "Relu" in converted_ops(result)


def test_functional_while_and_if_stay_native_with_their_reason():
    def build():
        x = placeholder("x")
        y = loop(tf.nn.relu(x, name="before"))
        tf.nn.relu(cond(y), name="after")

    result = segment_graph(graph_def(build), minimum_segment_size=1)
    reasons = reasons_by_name(result)
    (while_op,) = [n for n in result.view.nodes.values() if n.op in ("While", "StatelessWhile")]
    (if_op,) = [n for n in result.view.nodes.values() if n.op in ("If", "StatelessIf")]
    assert reasons[while_op.name] == FUNCTIONAL_OPS["While"] == "a tf.while_loop (loops stay native)"
    assert reasons[if_op.name] == FUNCTIONAL_OPS["If"]
    assert "before" not in reasons and "after" not in reasons  # both in segments
