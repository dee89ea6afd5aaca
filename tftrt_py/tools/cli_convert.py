"""tftrt-convert: convert a SavedModel from the shell (like ``saved_model_cli convert ... tensorrt``).

    tftrt-convert --input-dir model --output-dir model_trt --precision-mode FP16 --build-data batch8.npy

Each --build-data file (.npy: the one input; .npz: one array per input, keyed by input name or
saved positionally) is one input of ``converter.build()``, so engines are built for its shapes
and saved with the model; an engine op left without an engine for them fails the command (exit 1,
nothing saved) unless --allow-native-segments is given. Each --calibration-data file is one batch of
``convert(calibration_input_fn=...)`` (INT8). Prints the conversion summary.
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import List, Optional, Sequence

from tftrt_py.convert.params import CALIBRATION_ALGORITHMS
from tftrt_py.engine.builder import PRECISIONS
from tftrt_py.tools.cli import ToolError, add_common_flags, run_tool, shape_str
from tftrt_py.tools.inputs import load_arrays

__all__ = ["build_parser", "converter_kwargs", "main"]


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text} is not a positive integer")
    return value


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="tftrt-convert", description="Convert a SavedModel so its supported subgraphs run in tftrt_py "
                                          "engines (like saved_model_cli convert ... tensorrt).",
        epilog="Exit codes: 0 converted, 1 conversion failed (a message says why), 2 bad arguments.")
    p.add_argument("--input-dir", required=True, help="the SavedModel to convert")
    p.add_argument("--output-dir", required=True, help="where the converted SavedModel goes")
    p.add_argument("--overwrite", action="store_true", help="allow a non-empty --output-dir")
    p.add_argument("--tags", default="serve", help="comma-separated MetaGraph tags (default: serve)")
    p.add_argument("--signature-key", default="serving_default", help="signature to convert (default: %(default)s)")
    p.add_argument("--precision-mode", type=str.upper, choices=PRECISIONS, default="FP32")
    p.add_argument("--minimum-segment-size", type=int, default=3,
                   help="smallest subgraph turned into an engine; -1 converts nothing (default: %(default)s)")
    p.add_argument("--max-workspace-size-bytes", type=_positive, default=1 << 30)
    p.add_argument("--maximum-cached-engines", type=_positive, default=1,
                   help="engines each engine op keeps, by input shapes (default: %(default)s)")
    p.add_argument("--allow-build-at-runtime", action=argparse.BooleanOptionalAction, default=True,
                   help="build engines for unseen shapes when serving (default: allowed)")
    p.add_argument("--use-calibration", action=argparse.BooleanOptionalAction, default=True,
                   help="INT8: calibrate with --calibration-data (default: yes)")
    p.add_argument("--build-data", action="append", default=[], metavar="FILE",
                   help=".npy/.npz inputs to build engines for (repeatable: one build() input per file)")
    p.add_argument("--allow-native-segments", action="store_true",
                   help="save even when an engine op got no engine for the --build-data shapes (it then runs its "
                        "native segment); by default that is an error")
    p.add_argument("--calibration-data", action="append", default=[], metavar="FILE",
                   help=".npy/.npz calibration batch for INT8 (repeatable: one batch per file)")
    p.add_argument("--calibration-algorithm", type=str.lower, choices=CALIBRATION_ALGORITHMS, default=None,
                   help="calibrator for --calibration-data (default: entropy for INT8, minmax for FP8)")
    p.add_argument("--use-dynamic-shape", action="store_true", default=None,
                   help="build engines with shape profiles (passed to TrtGraphConverterV2(use_dynamic_shape))")
    p.add_argument("--profile-strategy", default=None,
                   help="shape profile strategy (passed to dynamic_shape_profile_strategy), e.g. Range, Optimal")
    p.add_argument("--no-summary", dest="summary", action="store_false", help="do not print the summary")
    add_common_flags(p)
    return p


def converter_kwargs(args: argparse.Namespace) -> dict:
    """TrtGraphConverterV2 keyword arguments for parsed flags (dynamic-shape ones only when given)."""
    kwargs = dict(input_saved_model_dir=args.input_dir,
                  input_saved_model_tags=[t.strip() for t in args.tags.split(",") if t.strip()],
                  input_saved_model_signature_key=args.signature_key,
                  precision_mode=args.precision_mode, minimum_segment_size=args.minimum_segment_size,
                  max_workspace_size_bytes=args.max_workspace_size_bytes,
                  maximum_cached_engines=args.maximum_cached_engines, use_calibration=args.use_calibration,
                  allow_build_at_runtime=args.allow_build_at_runtime,
                  calibration_algorithm=args.calibration_algorithm)
    if args.use_dynamic_shape:
        kwargs["use_dynamic_shape"] = True
    if args.profile_strategy is not None:
        kwargs["dynamic_shape_profile_strategy"] = args.profile_strategy
    return kwargs


def _items(paths: Sequence[str]) -> List:
    """One input_fn item per file: a tuple of arrays (positional) or a dict (by input name)."""
    items = []
    for path in paths:
        arrays = load_arrays(path)
        items.append(arrays if isinstance(arrays, dict) else tuple(arrays))
    return items


def _check_dirs(args) -> None:
    if not os.path.isdir(args.input_dir):
        raise ToolError(f"input SavedModel directory {args.input_dir!r} does not exist")
    if not any(os.path.exists(os.path.join(args.input_dir, f)) for f in ("saved_model.pb", "saved_model.pbtxt")):
        raise ToolError(f"{args.input_dir!r} holds no saved_model.pb: it is not a SavedModel directory")
    if os.path.isdir(args.output_dir) and os.listdir(args.output_dir) and not args.overwrite:
        raise ToolError(f"output directory {args.output_dir!r} is not empty; pass --overwrite to write into it")
    if os.path.abspath(args.output_dir) == os.path.abspath(args.input_dir):
        raise ToolError("--output-dir must differ from --input-dir")


def _run(args) -> int:
    _check_dirs(args)
    build_items = _items(args.build_data)  # read the files before the slow part
    calibration_items = _items(args.calibration_data)

    from tftrt_py import trt_convert as trt
    from tftrt_py.convert.summary import describe_native_runs
    from tftrt_py.engine_op import dispatcher

    converter = trt.TrtGraphConverterV2(**converter_kwargs(args))
    if calibration_items:
        converter.convert(calibration_input_fn=lambda: iter(calibration_items))
    else:
        converter.convert()
    if build_items:
        converter.build(input_fn=lambda: iter(build_items))
    native = converter.native_engine_ops()
    if native and not args.allow_native_segments:
        if args.summary:
            converter.summary()
        raise ToolError(f"{len(native)} engine op(s) got no engine for the --build-data shapes and would run their "
                        f"native segment: {'; '.join(describe_native_runs(native))}. "
                        f"Nothing was saved; pass --allow-native-segments to save anyway")
    converter.save(args.output_dir, overwrite=args.overwrite)
    if args.summary:
        converter.summary()
    print()
    for op in sorted(dispatcher.engine_ops().values(), key=lambda op: op.name):
        shapes = ["(" + ", ".join(shape_str(t.shape) for t in engine.inputs) + ")" for engine in op.engines()]
        print(f"{op.name}: {len(shapes)} engine(s) saved {' '.join(shapes)}".rstrip())
    print(f"Converted SavedModel written to {args.output_dir}"
          + ("" if build_items else " (no --build-data: engines get built at run time)"))
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    return run_tool(build_parser(), _run, argv)


if __name__ == "__main__":
    sys.exit(main())
