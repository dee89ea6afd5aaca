"""tftrt-inspect: engine descriptions of plans (without TensorFlow) and SavedModels, TensorBoard graphs."""
import glob
import json
import os

import pytest
import tensorflow as tf
from tensorflow.core.framework import graph_pb2

from tftrt_py.engine import Runtime
from tftrt_py.tools import cli_inspect

from test_cli_exec import NO_TF_MAIN


def test_plan_without_tensorflow(cnn_plans, run_cli):
    plan = cnn_plans[0][0]
    proc = run_cli(None, plan, code=NO_TF_MAIN.format(module="cli_inspect"))
    assert proc.returncode == 0, proc.stderr
    engine = Runtime().deserialize_cuda_engine(open(plan, "rb").read())
    for text in ["Engine TRTEngineOp_000_000", "Precision: FP32", "row-wise, serves batches up to 4",
                 "input    TensorRTInputPH_0   float32  4x32x32x3", "output   TensorRTOutputPH_0  float32  4x10",
                 "Layers after fusion", "Tactics:"] + [l.kind for l in engine.network.layers]:
        assert text in proc.stdout, text


def test_plan_json(cnn_plans, capsys):
    plan = cnn_plans[0][0]
    assert cli_inspect.main([plan, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    engine = Runtime().deserialize_cuda_engine(open(plan, "rb").read())
    [info] = report["engines"]
    assert [l["name"] for l in info["layers"]] == [l.name for l in engine.network.layers]
    assert [l["precision"] for l in info["layers"]] == [l.precision for l in engine.network.layers]
    assert sum(l["weight_bytes"] for l in info["layers"]) == info["weight_bytes"] == engine.weight_bytes
    assert info["bindings"][0] == {"binding": "input", "name": "TensorRTInputPH_0", "dtype": "float32",
                                   "shape": [4, 32, 32, 3]}
    assert report["plan_bytes"] == os.path.getsize(plan)


def test_saved_model_and_tensorboard(cnn_trt, run_cli, tmp_path):
    logdir = tmp_path / "tb"
    proc = run_cli("cli_inspect", cnn_trt.dir, "--tensorboard", str(logdir))
    assert proc.returncode == 0, proc.stderr
    for text in ["== TRTEngineOp_000_000", "Precision mode: FP32", "static engine: False", "Calibration table: none",
                 "Native segment: TRTEngineOp_000_000_native_segment", "Engines: 1",
                 "Engine TRTEngineOp_000_000 (from assets/trt-serialized-engine.TRTEngineOp_000_000)",
                 "Exclude Node: Placeholder, image", f"tensorboard --logdir {logdir}"]:
        assert text in proc.stdout, text
    [event_file] = glob.glob(str(logdir / "events.out.tfevents.*"))
    graphs = [e.graph_def for e in tf.compat.v1.train.summary_iterator(event_file) if e.graph_def]
    graph = graph_pb2.GraphDef.FromString(graphs[0])
    assert {n.op for n in graph.node} >= {"TRTEngineOp", "Placeholder"}
    [engine] = [n for n in graph.node if n.op == "TRTEngineOp"]
    assert engine.input[0].split(":")[0] == "image"
    segment = {f.signature.name: f for f in graph.library.function}["TRTEngineOp_000_000_native_segment"]
    assert {"Conv2D", "MaxPool", "Softmax"} <= {n.op for n in segment.node_def}


def test_errors(cnn_plans, tmp_path, capsys):
    assert cli_inspect.main([str(tmp_path / "missing")]) == 1
    assert "does not exist" in capsys.readouterr().err
    assert cli_inspect.main([cnn_plans[0][0], "--tensorboard", str(tmp_path)]) == 1
    assert "--tensorboard needs a SavedModel" in capsys.readouterr().err
    (tmp_path / "bad.plan").write_bytes(b"not a plan at all, not even close to one....")
    assert cli_inspect.main([str(tmp_path / "bad.plan")]) == 1
    assert "not a tftrt_py plan" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli_inspect.main([])
