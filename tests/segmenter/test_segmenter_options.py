"""minimum_segment_size, nodes_denylist, TF_TRT_OP_DENYLIST, and dtypes the converters reject."""
import pytest
import tensorflow as tf

from seg_graphs import graph_def, members, native, placeholder, relu_chain
from tftrt_py.segmenter import segment_graph


def relu_identity_graph():
    def build():
        x = tf.nn.relu(placeholder("x"), name="r1")
        x = tf.identity(tf.identity(x, name="i1"), name="i2")
        native(tf.nn.relu(x, name="r2"), "n")

    return graph_def(build)


def test_identities_do_not_count_towards_minimum_segment_size():
    result = segment_graph(relu_identity_graph(), minimum_segment_size=3)
    assert result.segments == []
    reason = "segment of 2 nodes is smaller than minimum_segment_size=3"
    assert result.report.reasons("Relu") == {reason: 2}
    assert result.report.reasons("Identity") == {reason: 2}

    (seg,) = segment_graph(relu_identity_graph(), minimum_segment_size=2).segments
    assert (seg.nodes, seg.size) == (["r1", "i1", "i2", "r2"], 2)


def test_identity_n_counts_as_tftrt_counts_it():
    def build():
        x = tf.nn.relu(placeholder("x"), name="r")
        native(tf.identity_n([x], name="idn")[0], "n")

    (seg,) = segment_graph(graph_def(build), minimum_segment_size=2).segments
    assert (seg.nodes, seg.size) == (["r", "idn"], 2)


def test_minimum_segment_size_minus_one_converts_nothing():
    result = segment_graph(relu_identity_graph(), minimum_segment_size=-1)
    assert result.segments == []
    assert result.report.converted_nodes == 0
    assert result.report.reasons("Relu") == {"minimum_segment_size=-1 disables conversion": 2}


def test_nodes_denylist_keeps_named_nodes_native():
    def build():
        relu_chain(placeholder("x"), ["r1", "r2", "r3", "r4", "r5"])

    result = segment_graph(graph_def(build), minimum_segment_size=2, nodes_denylist=["r3"])
    assert members(result) == [["r1", "r2"], ["r4", "r5"]]
    assert result.report.node_reasons["r3"] == ("Relu", "in nodes_denylist")


def test_op_denylist_env_var_is_read_at_call_time(monkeypatch):
    def build():
        x = tf.nn.relu(placeholder("x"), name="r")
        tf.tanh(tf.sigmoid(x, name="s"), name="t")

    monkeypatch.setenv("TF_TRT_OP_DENYLIST", " Sigmoid, Tanh,")
    result = segment_graph(graph_def(build), minimum_segment_size=1)
    assert members(result) == [["r"]]
    assert result.report.reasons("Sigmoid") == {"op type in TF_TRT_OP_DENYLIST": 1}
    assert result.report.reasons("Tanh") == {"op type in TF_TRT_OP_DENYLIST": 1}

    monkeypatch.delenv("TF_TRT_OP_DENYLIST")
    assert members(segment_graph(graph_def(build), minimum_segment_size=1)) == [["r", "s", "t"]]


def test_a_dtype_the_converter_rejects_stays_native():
    def build():
        relu_chain(placeholder("x", dtype=tf.float64), ["r1", "r2", "r3"])

    result = segment_graph(graph_def(build))
    assert result.segments == []
    (reason,) = result.report.reasons("Relu")
    assert reason.startswith("Relu with T=float64 is not supported")


@pytest.mark.parametrize("dtype", [tf.string, tf.variant])
def test_string_and_variant_tensors_never_join(dtype):
    def build():
        tf.identity(placeholder("x", (), dtype), name="id")

    result = segment_graph(graph_def(build), minimum_segment_size=0)
    assert result.segments == []
    assert result.report.node_reasons["id"] == ("Identity", f"uses a {dtype.name} tensor")
