"""tftrt-convert from the shell: flags reach the converter, data files are checked against the signature,
summary, exit codes 0 / 1 / 2 (errors in one line naming the flag)."""
import os
import sys
import tomllib

import numpy as np
import pytest
import tensorflow as tf

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


def test_dynamic_shape_calibration_and_loop_flags_pass_through():
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
    assert plain["compile_native_loops"] is False
    looped = parser.parse_args(["--input-dir", "a", "--output-dir", "b", "--compile-native-loops"])
    assert cli_convert.converter_kwargs(looped)["compile_native_loops"] is True
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


def error_line(capsys) -> str:
    """The one line a failed tftrt-convert printed on stderr."""
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("tftrt-convert: error: "), err
    return err[len("tftrt-convert: error: "):-1]


@pytest.mark.parametrize("flags, message", [
    (["--precision-mode", "INT8"], "--precision-mode INT8 calibrates: give --calibration-data FILE (one .npy/.npz "
                                   "batch per flag), or --no-use-calibration if the model's quantization ops give "
                                   "the ranges"),
    (["--precision-mode", "fp8"], "--precision-mode FP8 calibrates: give --calibration-data FILE"),
    (["--calibration-data", "c.npy"], "--calibration-data is not used with --precision-mode FP32: drop it, or "
                                      "calibrate with --precision-mode INT8 or FP8"),
    (["--precision-mode", "INT8", "--no-use-calibration", "--calibration-data", "c.npy"],
     "--calibration-data is not used with --no-use-calibration"),
])
def test_calibration_data_is_required_exactly_when_the_precision_calibrates(saved_model, tmp_path, capsys, flags,
                                                                            message):
    argv = ["--input-dir", saved_model("small_cnn"), "--output-dir", str(tmp_path / "o"), *flags]
    assert cli_convert.main(argv) == 1
    assert error_line(capsys).startswith(message)
    assert not (tmp_path / "o").exists()


def test_build_data_not_fitting_the_signature_is_one_line_naming_file_input_and_shapes(saved_model, tmp_path,
                                                                                      capsys):
    rng = np.random.default_rng(3)
    cases = {  # file -> what the error says after "--build-data <file>"
        "small.npy": (rng.standard_normal((2, 16, 16, 3)).astype("float32"),
                      ": input 'image' has shape 2x16x16x3; the signature takes ?x32x32x3"),
        "flat.npy": (rng.standard_normal((2, 32, 32)).astype("float32"),
                     ": input 'image' has shape 2x32x32; the signature takes ?x32x32x3"),
        "doubles.npy": (rng.standard_normal((2, 32, 32, 3)),
                        ": input 'image' has dtype float64; the signature takes float32"),
        "misnamed.npz": ({"img": rng.standard_normal((2, 32, 32, 3)).astype("float32")},
                         " arrays are named ['img']; expected ['image']"),
    }
    for name, (value, message) in cases.items():
        path = tmp_path / name
        np.savez(path, **value) if isinstance(value, dict) else np.save(path, value)
        argv = ["--input-dir", saved_model("small_cnn"), "--output-dir", str(tmp_path / "o"), "--build-data", str(path)]
        assert cli_convert.main(argv) == 1, name
        assert error_line(capsys) == f"--build-data {path}{message}"
        assert not (tmp_path / "o").exists()


class Blocks(tf.Module):
    """x [?, ?] -> x reshaped into 4x4 blocks, doubled: the signature takes any width, the graph multiples of 16."""

    @tf.function(input_signature=[tf.TensorSpec([None, None], tf.float32, name="x")])
    def serve(self, x):
        return {"y": tf.reshape(tf.nn.relu(x) * 2.0 + 1.0, [-1, 4, 4])}


def test_an_error_of_the_converted_signature_on_build_data_is_one_line_naming_the_file(tmp_path, capsys):
    module = Blocks()
    tf.saved_model.save(module, str(tmp_path / "blocks"), signatures={"serving_default": module.serve})
    rng = np.random.default_rng(4)
    np.save(tmp_path / "good.npy", rng.standard_normal((2, 16)).astype("float32"))
    np.save(tmp_path / "odd.npy", rng.standard_normal((2, 5)).astype("float32"))
    argv = ["--input-dir", str(tmp_path / "blocks"), "--output-dir", str(tmp_path / "o"), "--minimum-segment-size",
            "1", "--build-data", str(tmp_path / "good.npy"), "--build-data", str(tmp_path / "odd.npy")]
    assert cli_convert.main(argv) == 1
    error = error_line(capsys)
    assert error.startswith(f"--build-data {tmp_path / 'odd.npy'}: running the converted signature on it failed: ")
    assert "Input to reshape is a tensor with 10 values" in error and "Graph execution error" not in error
    assert not (tmp_path / "o").exists()
