"""Stand-alone plans (user guide 2.10): exported engines run without TensorFlow and match the in-graph engine."""
import json
import os
import re
import shutil

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.protobuf import saved_model_pb2

from tftrt_py.engine import Runtime
from tftrt_py.tools import cli_inspect, export
from tftrt_py.tools.export import ExportError, excluded_nodes, export_plans

NO_TF_RUN = """
import sys, numpy as np
from tftrt_py.engine import Runtime
plan, data = sys.argv[1], np.load(sys.argv[2])
engine = Runtime().deserialize_cuda_engine(open(plan, "rb").read())
assert engine.num_bindings == 2 and engine.binding_is_input(0) and not engine.binding_is_input(1)
assert engine.get_binding_index("TensorRTInputPH_0") == 0 and engine.get_binding_index("TensorRTOutputPH_0") == 1
assert engine.get_binding_shape("TensorRTInputPH_0") == (4, 32, 32, 3)
assert engine.get_binding_shape(1) == (4, 10) and engine.get_binding_dtype("TensorRTOutputPH_0") == np.float32
context = engine.create_execution_context()
out = context.execute_async({"TensorRTInputPH_0": data["x"]})["TensorRTOutputPH_0"]
np.testing.assert_allclose(out, data["expected"], rtol=1e-5, atol=1e-6)
assert "tensorflow" not in sys.modules, sorted(m for m in sys.modules if m.startswith("tensorflow"))
print("ok")
"""


def test_export_writes_plans_and_sidecars(cnn_plans):
    paths, out = cnn_plans
    assert [os.path.basename(p) for p in paths] == ["TRTEngineOp_000_000_0.plan"]
    with open(os.path.join(out, "TRTEngineOp_000_000_0.json")) as f:
        info = json.load(f)
    assert info["inputs"] == [{"name": "TensorRTInputPH_0", "dtype": "float32", "shape": [4, 32, 32, 3]}]
    assert info["outputs"] == [{"name": "TensorRTOutputPH_0", "dtype": "float32", "shape": [4, 10]}]
    assert info["source"] == "assets/trt-serialized-engine.TRTEngineOp_000_000" and info["tf_inputs"] == ["image"]
    assert info["tf_input_shapes"] == [[-1, 32, 32, 3]] and info["rowwise"] is True


def test_excluded_nodes_print_like_the_user_guide(cnn_trt):
    lines = []
    assert excluded_nodes(cnn_trt.dir, print_fn=lines.append) == [("Placeholder", "image")]
    assert lines == ["Exclude Node: Placeholder, image", "Node: TRTEngineOp, TRTEngineOp_000_000"]


def test_unconverted_models_and_bad_arguments(saved_model, tmp_path):
    original = saved_model("small_cnn")
    assert "Conv2D" in {op for op, _ in excluded_nodes(original)}  # the Keras graph behind the signature wrappers
    with pytest.raises(ExportError, match="has no TRTEngineOp nodes"):
        export_plans(original, str(tmp_path / "out"))
    with pytest.raises(ExportError, match="does not exist"):
        export_plans(str(tmp_path / "missing"), str(tmp_path / "out"))
    with pytest.raises(ExportError, match=r"no signature 'nope'; available: \[.*'serving_default'\]"):
        export_plans(original, str(tmp_path / "out"), signature_key="nope")


def test_plan_matches_the_engine_inside_the_graph(cnn_trt, cnn_plans):
    from tftrt_py import trt_convert as trt

    x = np.random.default_rng(7).standard_normal((3, 32, 32, 3)).astype("float32")  # batch 3 < engine batch 4
    signature = tf.saved_model.load(cnn_trt.dir).signatures["serving_default"]
    runs = lambda: sum(s["engine_runs"] for s in trt.engine_op_stats().values())
    fallbacks = lambda: sum(s["fallback_total"] for s in trt.engine_op_stats().values())
    before = runs(), fallbacks()
    in_graph = signature(image=tf.constant(x))["output_0"].numpy()
    assert (runs(), fallbacks()) == (before[0] + 1, before[1]), "the engine op did not run its engine"
    engine = Runtime().deserialize_cuda_engine(open(cnn_plans[0][0], "rb").read())
    standalone = engine.create_execution_context().execute({"TensorRTInputPH_0": x})["TensorRTOutputPH_0"]
    np.testing.assert_allclose(standalone, in_graph, rtol=1e-5, atol=1e-6)


def _static_copy(src, dst, plan: bytes, calibration: bytes):
    """A copy of a converted SavedModel whose engine op is static: its plan in serialized_segment."""
    shutil.copytree(src, dst)
    saved_model = saved_model_pb2.SavedModel()
    with open(os.path.join(dst, "saved_model.pb"), "rb") as f:
        saved_model.ParseFromString(f.read())
    nodes = [n for f in saved_model.meta_graphs[0].graph_def.library.function for n in f.node_def
             if n.op == "TRTEngineOp"]
    for node in nodes:
        node.attr["serialized_segment"].s = plan
        node.attr["static_engine"].b = True
        node.attr["calibration_data"].s = calibration
    with open(os.path.join(dst, "saved_model.pb"), "wb") as f:
        f.write(saved_model.SerializeToString())
    return len(nodes)


def test_static_engine_through_the_user_guide_loop(cnn_trt, cnn_plans, tmp_path, run_cli, capsys, monkeypatch):
    plan = open(cnn_plans[0][0], "rb").read()
    static = str(tmp_path / "static")
    assert _static_copy(cnn_trt.dir, static, plan, b'{"TensorRTInputPH_0": 2.5}') == 1

    paths = export_plans(static, str(tmp_path / "plans"))
    assert [os.path.basename(p) for p in paths] == ["TRTEngineOp_000_000_0.plan", "TRTEngineOp_000_000_1.plan"]
    assert open(paths[0], "rb").read() == plan
    assert json.load(open(paths[0][:-5] + ".json"))["source"] == "serialized_segment"

    # The user guide's script, over the converted graph (tf.gfile.GFile -> open).
    monkeypatch.chdir(tmp_path)
    for n in export.converted_graph_def(static).node:
        if n.op == "TRTEngineOp":
            print("Node: %s, %s" % (n.op, n.name.replace("/", "_")))
            with open("%s.plan" % (n.name.replace("/", "_")), "wb") as f:
                f.write(n.attr["serialized_segment"].s)
        else:
            print("Exclude Node: %s, %s" % (n.op, n.name.replace("/", "_")))
    printed = capsys.readouterr().out
    assert "Node: TRTEngineOp, TRTEngineOp_000_000" in printed and "Exclude Node: Placeholder, image" in printed

    x = np.random.default_rng(3).standard_normal((4, 32, 32, 3)).astype("float32")
    expected = Runtime().deserialize_cuda_engine(plan).create_execution_context().execute_v2([x])[0]
    np.savez(tmp_path / "io.npz", x=x, expected=expected)
    proc = run_cli(None, str(tmp_path / "TRTEngineOp_000_000.plan"), str(tmp_path / "io.npz"), code=NO_TF_RUN)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr

    assert cli_inspect.main([static, "--json"]) == 0
    [op] = json.loads(capsys.readouterr().out)["engine_ops"]
    assert op["attrs"]["static_engine"] is True and op["calibration_table"] == {"TensorRTInputPH_0": 2.5}
    assert [e["source"] for e in op["engines"]] == ["serialized_segment",
                                                    "assets/trt-serialized-engine.TRTEngineOp_000_000"]


def test_tftrt_export_command(cnn_trt, tmp_path, capsys):
    assert export.main([cnn_trt.dir, str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "Node: TRTEngineOp, TRTEngineOp_000_000" in out and "Wrote 1 plan(s)" in out
    assert "TensorRTInputPH_0 float32 4x32x32x3 -> TensorRTOutputPH_0 float32 4x10" in out
    assert export.main([str(tmp_path / "missing"), str(tmp_path)]) == 1
    assert "does not exist" in capsys.readouterr().err


def test_tftrt_export_replaces_existing_files_only_with_overwrite(cnn_trt, cnn_plans, tmp_path, capsys):
    plan, sidecar = tmp_path / "TRTEngineOp_000_000_0.plan", tmp_path / "TRTEngineOp_000_000_0.json"
    plan.write_bytes(b"someone else's plan")
    assert export.main([cnn_trt.dir, str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert err == (f"tftrt-export: error: {plan} already exists: pass --overwrite (overwrite=True) to replace, or "
                   "choose another output directory\n")
    assert plan.read_bytes() == b"someone else's plan" and not sidecar.exists()  # nothing written
    assert export.main([cnn_trt.dir, str(tmp_path), "--overwrite"]) == 0
    assert plan.read_bytes() == open(cnn_plans[0][0], "rb").read() and sidecar.is_file()


def test_export_plans_refuses_existing_files_and_writes_nothing(cnn_trt, tmp_path):
    plan, sidecar = tmp_path / "TRTEngineOp_000_000_0.plan", tmp_path / "TRTEngineOp_000_000_0.json"
    plan.write_bytes(b"plan")
    sidecar.write_text("{}")
    with pytest.raises(ExportError, match=r"TRTEngineOp_000_000_0\.plan and 1 more file\(s\) already exist: pass "
                                          r"--overwrite \(overwrite=True\) to replace"):
        export_plans(cnn_trt.dir, str(tmp_path))
    assert (plan.read_bytes(), sidecar.read_text()) == (b"plan", "{}")
    assert len(export_plans(cnn_trt.dir, str(tmp_path), overwrite=True)) == 1
    assert json.loads(sidecar.read_text())["plan"] == "TRTEngineOp_000_000_0.plan"


def _tf1_saved_model(path, rng):
    """A TF1 SavedModel (placeholder x [None, 16] -> softmax(relu(x w1 + b) w2) named y) and its weights."""
    w1, b, w2 = (rng.standard_normal(s).astype("float32") for s in ((16, 32), (32,), (32, 10)))
    with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
        x = tf.compat.v1.placeholder(tf.float32, [None, 16], name="x")
        y = tf.identity(tf.nn.softmax(tf.matmul(tf.nn.relu(tf.matmul(x, w1) + b), w2)), name="y")
        builder = tf.compat.v1.saved_model.Builder(path)
        builder.add_meta_graph_and_variables(
            sess, ["serve"], signature_def_map={"serving_default": tf.compat.v1.saved_model.predict_signature_def(
                {"x": x}, {"y": y})})
        builder.save()
    return w1, b, w2


def test_tf1_static_engines_export(tmp_path):
    from tftrt_py import trt_convert as trt

    if not hasattr(trt, "TrtGraphConverter"):
        pytest.skip("no TF1 converter")
    rng = np.random.default_rng(11)
    w1, b, w2 = _tf1_saved_model(str(tmp_path / "tf1"), rng)
    with tf.Graph().as_default():
        converter = trt.TrtGraphConverter(input_saved_model_dir=str(tmp_path / "tf1"), max_batch_size=4)
        converter.convert()
        converter.save(str(tmp_path / "tf1_trt"))
    lines = []
    assert excluded_nodes(str(tmp_path / "tf1_trt"), print_fn=lines.append) == [("Placeholder", "x"), ("Identity", "y")]
    assert lines[0] == "Exclude Node: Placeholder, x" and lines[2] == "Exclude Node: Identity, y"
    assert re.fullmatch(r"Node: TRTEngineOp, TRTEngineOp_\d{3}_000", lines[1])  # graph index: per-process count
    [path] = export_plans(str(tmp_path / "tf1_trt"), str(tmp_path / "plans"))
    assert json.load(open(path[:-5] + ".json"))["source"] == "serialized_segment"
    engine = Runtime().deserialize_cuda_engine(open(path, "rb").read())
    x = rng.standard_normal((3, 16)).astype("float32")
    logits = np.maximum(x @ w1 + b, 0) @ w2
    expected = np.exp(logits - logits.max(1, keepdims=True))
    expected /= expected.sum(1, keepdims=True)
    got = engine.create_execution_context().execute({"TensorRTInputPH_0": x})["TensorRTOutputPH_0"]
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
