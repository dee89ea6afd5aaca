"""What the tools share: every error reaches the user as one line."""
import argparse

from tftrt_py.tools.cli import one_line, run_tool

TF_RUNTIME_ERROR = ("Graph execution error:\n\nDetected at node model/reshape defined at (most recent call last):\n"
                    "<stack traces unavailable>\nInput to reshape is a tensor with 10 values, but the requested shape "
                    "requires a multiple of 16\n\t [[{{node model/reshape}}]]\n\t [[TRTEngineOp_000_000]] "
                    "[Op:__inference_pruned_12]")


def test_one_line_joins_lines_and_drops_tensorflows_boilerplate():
    assert one_line(ValueError(TF_RUNTIME_ERROR)) == ("Input to reshape is a tensor with 10 values, but the requested "
                                                      "shape requires a multiple of 16")
    assert one_line(ValueError("first\n\tsecond  \n")) == "first second"
    assert one_line(ValueError("[[{{node x}}]]")) == "[[{{node x}}]]"  # nothing but boilerplate: kept
    assert one_line(KeyError()) == ""


def test_run_tool_prints_a_multi_line_error_as_one_line(capsys):
    def body(args):
        raise RuntimeError(TF_RUNTIME_ERROR)

    assert run_tool(argparse.ArgumentParser(prog="tool"), body, []) == 1
    assert capsys.readouterr().err == ("tool: error: RuntimeError: Input to reshape is a tensor with 10 values, but "
                                       "the requested shape requires a multiple of 16\n")
