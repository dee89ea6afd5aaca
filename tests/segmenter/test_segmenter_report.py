"""The non-conversion report: op types left native, their counts and reasons, logged once."""
import logging

import tensorflow as tf

from seg_graphs import graph_def, native, placeholder, relu_chain
from tftrt_py.segmenter import segment_graph


def mixed_graph():
    def build():
        x = relu_chain(placeholder("x"), ["a1", "a2", "a3"])
        x = native(native(x, "n1"), "n2")
        relu_chain(x, ["b1", "b2"])  # too small with the default minimum_segment_size=3

    return graph_def(build)


def test_report_counts_native_op_types_and_reasons():
    report = segment_graph(mixed_graph()).report
    assert (report.total_nodes, report.converted_nodes, report.native_nodes, report.num_segments) == (10, 3, 7, 1)
    assert report.count("Cumsum") == 2
    assert report.reasons("Cumsum") == {"no converter for op Cumsum": 2}
    assert report.reasons("Relu") == {"segment of 2 nodes is smaller than minimum_segment_size=3": 2}
    assert report.reasons("Placeholder") == {"graph input": 1}
    assert report.count("Const") == 2  # the Cumsum axes
    assert report.count("Sigmoid") == 0 and report.reasons("Sigmoid") == {}
    assert list(report.by_op_type()) == ["Const", "Cumsum", "Relu", "Placeholder"]


def test_report_formats_as_a_table():
    text = segment_graph(mixed_graph()).report.format()
    lines = text.splitlines()
    assert lines[0] == "3 of 10 nodes converted into 1 segment(s); 7 stay native."
    assert lines[1].split() == ["op", "type", "count", "reasons"]
    assert any(line.split()[:2] == ["Cumsum", "2"] and line.endswith("no converter for op Cumsum (2)")
               for line in lines)


def test_report_is_logged_once_and_per_node_reasons_at_info(caplog):
    """Verbosity 1 (TFTRT_VMODULE=segmenter=1) shows every native node and its reason."""
    caplog.set_level(logging.INFO, logger="tftrt_py.segmenter")
    report = segment_graph(mixed_graph()).report
    infos = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert sum(report.format() in m for m in infos) == 1
    assert "n1 (Cumsum) stays native: no converter for op Cumsum" in infos
    assert len([m for m in infos if " stays native: " in m]) == report.native_nodes


def test_a_fully_converted_graph_reports_no_native_op_type_but_its_inputs():
    def build():
        tf.add(placeholder("x"), tf.constant(1.0, name="c"), name="add")

    report = segment_graph(graph_def(build), minimum_segment_size=1).report
    assert report.by_op_type() == {"Placeholder": {"graph input": 1}}
