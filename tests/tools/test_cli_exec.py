"""tftrt-exec: latency and throughput reports for plans (without TensorFlow) and SavedModels, profiles, errors."""
import json

import numpy as np
import pytest

from tftrt_py.engine import Runtime
from tftrt_py.tools import cli_exec

NO_TF_MAIN = """
import sys
from tftrt_py.tools import {module}
code = {module}.main(sys.argv[1:])
assert "tensorflow" not in sys.modules, sorted(m for m in sys.modules if m.startswith("tensorflow"))
sys.exit(code)
"""


def check_report(report, batch, iterations, layers):
    lat = report["latency_ms"]
    assert 0 < lat["min"] <= lat["median"] <= lat["p90"] <= lat["p99"] <= lat["max"]
    assert lat["min"] <= lat["mean"] <= lat["max"] and len(report["latencies_ms"]) == iterations
    assert report["batch"] == batch and report["iterations"] == iterations
    thr = report["throughput"]
    assert thr["samples_per_s"] == pytest.approx(thr["inferences_per_s"] * batch)
    assert thr["inferences_per_s"] == pytest.approx(iterations / report["total_s"])
    rows = report["profile"]["layers"]
    assert [r["name"] for r in rows] == layers
    assert all(r["calls"] == iterations and r["mean_ms"] >= 0 for r in rows)
    assert sum(r["percent"] for r in rows) == pytest.approx(100.0)


def test_plan_report_without_tensorflow(cnn_plans, run_cli, tmp_path):
    plan = cnn_plans[0][0]
    proc = run_cli(None, plan, "--warmup", "2", "--iterations", "20", "--batch", "2", "--profile",
                   "--export-json", str(tmp_path / "r.json"), code=NO_TF_MAIN.format(module="cli_exec"))
    assert proc.returncode == 0, proc.stderr
    for text in ("Latency: min = ", "median = ", "p99 = ", "Throughput: ", "samples/s", "Per-layer profile (20 runs)",
                 "% of total", "Input: TensorRTInputPH_0 float32 2x32x32x3 (synthetic, seed 0)"):
        assert text in proc.stdout
    report = json.load(open(tmp_path / "r.json"))
    engine = Runtime().deserialize_cuda_engine(open(plan, "rb").read())
    assert report["kind"] == "plan" and report["warmup"] == 2
    check_report(report, 2, 20, [l.name for l in engine.network.layers])
    assert {r["kind"] for r in report["profile"]["layers"]} == {l.kind for l in engine.network.layers}


def test_plan_inputs_from_files_and_shape_overrides(cnn_plans, tmp_path, capsys):
    plan = cnn_plans[0][0]
    np.savez(tmp_path / "x.npz", TensorRTInputPH_0=np.ones((3, 32, 32, 3), "float32"))
    assert cli_exec.main([plan, "--inputs", str(tmp_path / "x.npz"), "--iterations", "3", "--warmup", "0",
                          "--export-json", str(tmp_path / "r.json")]) == 0
    report = json.load(open(tmp_path / "r.json"))
    assert report["batch"] == 3 and report["inputs"][0]["source"] == str(tmp_path / "x.npz")
    assert "profile" not in report
    assert cli_exec.main([plan, "--shapes", "TensorRTInputPH_0:1x32x32x3", "--iterations", "2", "--seed", "5",
                          "--export-json", str(tmp_path / "r.json")]) == 0
    assert json.load(open(tmp_path / "r.json"))["inputs"][0]["shape"] == [1, 32, 32, 3]
    capsys.readouterr()


@pytest.mark.parametrize("backend", ["numpy", "onnxruntime"])
def test_plan_runs_on_the_backend_asked_for(cnn_plans, capsys, backend):
    pytest.importorskip(backend)
    assert cli_exec.main([cnn_plans[0][0], "--backend", backend, "--iterations", "2", "--warmup", "0"]) == 0
    assert f"FP32, {backend} backend on cpu" in capsys.readouterr().out


def test_plan_errors(cnn_plans, tmp_path, capsys):
    plan = cnn_plans[0][0]
    damaged = tmp_path / "damaged.plan"
    damaged.write_bytes(open(plan, "rb").read()[:-100])
    cases = [
        ([plan, "--batch", "8"], "cannot run input shapes (8x32x32x3): it was built for (4x32x32x3) and it serves "
                                 "batches up to 4"),
        ([plan, "--shapes", "TensorRTInputPH_0:4x16x16x3"], "cannot run input shapes (4x16x16x3)"),
        ([plan, "--shapes", "image:1x32x32x3"], "the plan has no such input; its inputs: ['TensorRTInputPH_0']"),
        ([str(tmp_path / "missing.plan")], "does not exist"),
        ([str(damaged)], "PlanError: plan checksum mismatch: the file is truncated"),
        ([plan, "--inputs", str(tmp_path / "missing.npz")], "input file"),
        ([plan, "--backend", "tpu"], "unknown backend 'tpu' (known: cupy, numpy, onnxruntime)"),
    ]
    for args, message in cases:
        assert cli_exec.main(args) == 1, args
        err = capsys.readouterr().err
        assert err.startswith("tftrt-exec: error: ") and message in err and "Traceback" not in err
    for args in ([plan, "--iterations", "0"], [plan, "--shapes", "TensorRTInputPH_0"], [plan, "--warmup", "x"]):
        with pytest.raises(SystemExit) as exit_info:
            cli_exec.main(args)
        assert exit_info.value.code == 2
    capsys.readouterr()


def test_saved_model_report_and_profile(cnn_trt, cnn_plans, run_cli, tmp_path):
    proc = run_cli("cli_exec", cnn_trt.dir, "--batch", "3", "--warmup", "2", "--iterations", "10", "--profile",
                   "--export-json", str(tmp_path / "r.json"))
    assert proc.returncode == 0, proc.stderr
    report = json.load(open(tmp_path / "r.json"))
    assert report["kind"] == "saved_model"
    assert report["inputs"] == [{"name": "image", "dtype": "float32", "shape": [3, 32, 32, 3],
                                 "source": "synthetic, seed 0"}]
    [(name, stats)] = report["engine_ops"].items()
    assert name == "TRTEngineOp_000_000" and stats["fallback_total"] == 0 and stats["builds"] == 0
    assert stats["engine_runs"] == 2 + 10 + 10  # warm-up, timed, profiled
    engine = Runtime().deserialize_cuda_engine(open(cnn_plans[0][0], "rb").read())
    check_report(report, 3, 10, [l.name for l in engine.network.layers])
    assert "Engine op TRTEngineOp_000_000: 1 engine(s), 22 engine runs, native-segment runs: none" in proc.stdout
    proc = run_cli("cli_exec", cnn_trt.dir, "--backend", "numpy")
    assert proc.returncode == 1 and "--backend applies to .plan files" in proc.stderr


def test_latency_summary():
    s = cli_exec.latency_summary(list(range(1, 101)))
    assert (s["min"], s["max"], s["mean"], s["median"]) == (1, 100, 50.5, 50.5)
    assert s["p99"] == pytest.approx(99.01) and s["p90"] == pytest.approx(90.1)
