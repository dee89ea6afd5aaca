"""tftrt-convert from the shell: flags reach the converter, summary, exit codes 0 / 1 / 2."""
import os
import sys
import tomllib

import numpy as np
import pytest

from tftrt_py.tools import cli_convert
from tftrt_py.tools.export import find_engines, with_default_attrs

REPO = os.path.join(os.path.dirname(__file__), "..", "..")


def test_convert_prints_the_summary_and_saves_engines(cnn_trt):
    out = cnn_trt.proc.stdout
    assert "[*] Total number of TensorRT engines: 1" in out
    assert "TRTEngineOp_000_000: 1 engine(s) saved (4x32x32x3)" in out
    assert f"Converted SavedModel written to {cnn_trt.dir}" in out
    assert "Traceback" not in cnn_trt.proc.stderr
    assert os.path.isfile(os.path.join(cnn_trt.dir, "assets", "trt-serialized-engine.TRTEngineOp_000_000"))


def test_flags_reach_the_engine_ops(saved_model, run_cli, tmp_path):
    rng = np.random.default_rng(1)
    for batch in (2, 4):  # .npz keyed by input name; one build() input per file
        np.savez(tmp_path / f"b{batch}.npz", image=rng.standard_normal((batch, 32, 32, 3)).astype("float32"))
    out = tmp_path / "out"
    proc = run_cli("cli_convert", "--input-dir", saved_model("small_cnn"), "--output-dir", str(out),
                   "--precision-mode", "fp16", "--minimum-segment-size", "2", "--max-workspace-size-bytes", "1000000",
                   "--maximum-cached-engines", "2", "--no-allow-build-at-runtime", "--tags", "serve",
                   "--signature-key", "serving_default", "--build-data", str(tmp_path / "b2.npz"),
                   "--build-data", str(tmp_path / "b4.npz"), "--no-summary")
    assert proc.returncode == 0, proc.stderr
    assert "Total number of TensorRT engines" not in proc.stdout
    [record] = find_engines(str(out))
    attrs = with_default_attrs(record.node).attr
    assert attrs["precision_mode"].s == b"FP16"
    assert attrs["max_cached_engines_count"].i == 2
    assert attrs["workspace_size_bytes"].i == 1000000
    assert attrs["_allow_build_at_runtime"].b is False
    assert len(record.plans) == 2, proc.stdout


@pytest.mark.parametrize("args, message", [
    (["--output-dir", "x"], "the following arguments are required: --input-dir"),
    (["--input-dir", "x", "--output-dir", "y", "--precision-mode", "FP64"], "invalid choice: 'FP64'"),
    (["--input-dir", "x", "--output-dir", "y", "--minimum-segment-size", "three"], "invalid int value"),
    (["--input-dir", "x", "--output-dir", "y", "--maximum-cached-engines", "0"], "not a positive integer"),
])
def test_bad_arguments_exit_2(run_cli, args, message):
    proc = run_cli("cli_convert", *args)
    assert proc.returncode == 2 and message in proc.stderr and "Traceback" not in proc.stderr


def test_errors_exit_1_with_one_line(saved_model, run_cli, tmp_path):
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "file").write_text("x")
    cases = [
        (["--input-dir", str(tmp_path / "missing"), "--output-dir", str(tmp_path / "o")], "does not exist"),
        (["--input-dir", str(tmp_path), "--output-dir", str(tmp_path / "o")], "not a SavedModel directory"),
        (["--input-dir", saved_model("small_cnn"), "--output-dir", str(tmp_path / "full")], "is not empty"),
        (["--input-dir", saved_model("small_cnn"), "--output-dir", str(tmp_path / "o"), "--build-data",
          str(tmp_path / "nope.npy")], "input file"),
    ]
    for args, message in cases:
        proc = run_cli("cli_convert", *args)
        assert proc.returncode == 1, (args, proc.stderr)
        assert proc.stderr.strip().splitlines()[-1].startswith("tftrt-convert: error:") and message in proc.stderr
        assert "Traceback" not in proc.stderr
    proc = run_cli("cli_convert", *cases[0][0], "--verbose")
    assert proc.returncode == 1 and "Traceback" in proc.stderr


def test_overwrite_converts_into_a_non_empty_output_dir(saved_model, run_cli, tmp_path):
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "file").write_text("x")
    proc = run_cli("cli_convert", "--input-dir", saved_model("small_cnn"), "--output-dir", str(tmp_path / "full"),
                   "--overwrite")
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "full" / "saved_model.pb").is_file()


def test_conversion_errors_exit_1_without_traceback(saved_model, run_cli, tmp_path):
    proc = run_cli("cli_convert", "--input-dir", saved_model("small_cnn"), "--output-dir", str(tmp_path / "o"),
                   "--signature-key", "nope")
    assert proc.returncode == 1
    assert "has no signature 'nope'" in proc.stderr and "Traceback" not in proc.stderr


def test_dynamic_shape_and_calibration_flags_pass_through():
    parser = cli_convert.build_parser()
    args = parser.parse_args(["--input-dir", "a", "--output-dir", "b", "--use-dynamic-shape",
                              "--profile-strategy", "Optimal", "--calibration-data", "c.npz", "--tags", "serve,gpu"])
    kwargs = cli_convert.converter_kwargs(args)
    assert kwargs["use_dynamic_shape"] is True and kwargs["dynamic_shape_profile_strategy"] == "Optimal"
    assert kwargs["input_saved_model_tags"] == ["serve", "gpu"] and args.calibration_data == ["c.npz"]
    plain = cli_convert.converter_kwargs(parser.parse_args(["--input-dir", "a", "--output-dir", "b"]))
    assert "use_dynamic_shape" not in plain and "dynamic_shape_profile_strategy" not in plain
    assert plain["allow_build_at_runtime"] is True and plain["precision_mode"] == "FP32"
    assert plain["calibration_algorithm"] is None  # the precision's default calibrator
    chosen = parser.parse_args(["--input-dir", "a", "--output-dir", "b", "--calibration-algorithm", "MinMax"])
    assert cli_convert.converter_kwargs(chosen)["calibration_algorithm"] == "minmax"


def test_console_scripts_are_registered():
    with open(os.path.join(REPO, "pyproject.toml"), "rb") as f:
        scripts = tomllib.load(f)["project"]["scripts"]
    assert set(scripts) >= {"tftrt-convert", "tftrt-exec", "tftrt-inspect", "tftrt-export"}
    for target in scripts.values():
        module, func = target.split(":")
        __import__(module)
        assert callable(getattr(sys.modules[module], func))


FAILING_BUILD = """
import sys
import tftrt_py.convert.build as build_lib
from tftrt_py.convert.errors import InvalidNodeError
from tftrt_py.tools import cli_convert

def broken(*args, **kwargs):
    raise InvalidNodeError("input 1 of Reshape must be known when building")

build_lib.build_engine = broken
sys.exit(cli_convert.main(sys.argv[1:]))
"""


def test_an_engine_left_unbuilt_exits_1_unless_allowed(saved_model, run_cli, tmp_path):
    np.save(tmp_path / "b4.npy", np.random.default_rng(2).standard_normal((4, 32, 32, 3)).astype("float32"))
    args = ["--input-dir", saved_model("small_cnn"), "--build-data", str(tmp_path / "b4.npy")]
    proc = run_cli(None, *args, "--output-dir", str(tmp_path / "strict"), code=FAILING_BUILD)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    error = proc.stderr.strip().splitlines()[-1]
    assert error.startswith("tftrt-convert: error: 1 engine op(s) got no engine for the --build-data shapes")
    assert "TRTEngineOp_000_000, input shapes [[4, 32, 32, 3]]" in error and "must be known when building" in error
    assert "--allow-native-segments" in error
    assert "[!] 1 engine op(s)" in proc.stdout  # the summary says it too
    assert not os.path.exists(tmp_path / "strict" / "saved_model.pb")
    proc = run_cli(None, *args, "--output-dir", str(tmp_path / "allowed"), "--allow-native-segments",
                   code=FAILING_BUILD)
    assert proc.returncode == 0, proc.stderr
    assert "TRTEngineOp_000_000: 0 engine(s) saved" in proc.stdout
    assert os.path.isfile(tmp_path / "allowed" / "saved_model.pb")
