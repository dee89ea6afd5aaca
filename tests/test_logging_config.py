"""TFTRT_VMODULE: per-module verbosity (1 INFO, 2 DEBUG), applied on import, without TensorFlow."""
import logging
import os
import subprocess
import sys

import pytest

from tftrt_py import logging_config


@pytest.fixture
def restore_levels():
    names = ["tftrt_py", "tftrt_py.segmenter", "tftrt_py.convert", "tftrt_py.convert.ops"]
    saved = {n: logging.getLogger(n).level for n in names}
    yield
    for n, level in saved.items():
        logging.getLogger(n).setLevel(level)


def test_parse():
    assert logging_config.parse_vmodule("segmenter=2, convert.ops=1,tftrt_py.engine=0,") == {
        "tftrt_py.segmenter": 2, "tftrt_py.convert.ops": 1, "tftrt_py.engine": 0}
    assert logging_config.parse_vmodule("") == {}


@pytest.mark.parametrize("spec", ["segmenter", "segmenter=x", "=2"])
def test_malformed_specs_raise_and_configure_ignores_them(spec, caplog):
    with pytest.raises(ValueError):
        logging_config.parse_vmodule(spec)
    assert logging_config.configure(spec) == {}
    assert any("TFTRT_VMODULE" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("verbosity,level", [(0, logging.WARNING), (1, logging.INFO), (2, logging.DEBUG),
                                             (3, logging.DEBUG)])
def test_levels(verbosity, level, restore_levels):
    logging_config.configure(f"segmenter={verbosity}")
    assert logging.getLogger("tftrt_py.segmenter.segmentation").getEffectiveLevel() == level


def test_level_1_logs_every_unconverted_node_and_its_reason(caplog, restore_levels):
    from seg_graphs import graph_def, native, placeholder, relu_chain
    from tftrt_py.segmenter import segment_graph

    logging_config.configure("segmenter=1")
    report = segment_graph(graph_def(lambda: relu_chain(native(relu_chain(placeholder(), ["a", "b", "c"]), "n"),
                                                        ["d"]))).report
    lines = [r.getMessage() for r in caplog.records if r.name.startswith("tftrt_py.segmenter")]
    for name, (op, reason) in report.node_reasons.items():
        assert f"{name} ({op}) stays native: {reason}" in lines
    assert "n (Cumsum) stays native: no converter for op Cumsum" in lines
    assert not any(r.levelno == logging.DEBUG for r in caplog.records if r.name.startswith("tftrt_py.segmenter"))


def test_level_2_logs_each_conversion(caplog, restore_levels):
    import numpy as np
    import tensorflow as tf

    from support import run_engine

    logging_config.configure("convert=2")
    run_engine(lambda t: tf.nn.relu(t) * 2.0, [np.ones((2, 3), np.float32)])
    assert any(r.levelno == logging.DEBUG and "(Relu)" in r.getMessage() for r in caplog.records)


def test_the_environment_variable_applies_on_import_without_tensorflow():
    code = ("import logging, sys, tftrt_py; "
            "print(logging.getLogger('tftrt_py.segmenter').level, logging.getLogger('tftrt_py.convert').level, "
            "'tensorflow' in sys.modules)")
    env = dict(os.environ, TFTRT_VMODULE="segmenter=2,convert=1")
    out = subprocess.run([sys.executable, "-c", code], env=env, check=True, capture_output=True, text=True,
                         cwd=os.path.join(os.path.dirname(__file__), ".."))
    assert out.stdout.split() == [str(logging.DEBUG), str(logging.INFO), "False"]
