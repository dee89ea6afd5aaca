"""tftrt-convert: convert a SavedModel from the shell (like ``saved_model_cli convert ... tensorrt``).

    tftrt-convert --input-dir model --output-dir model_trt --precision-mode FP16 --build-data batch8.npy

Each --build-data file (.npy: the one input; .npz: one array per input, keyed by input name or
saved positionally, in the order of the signature's sorted input names) is one input of
``converter.build()``, so engines are built for its shapes and saved with the model; an engine op left
without an engine for them fails the command (exit 1, nothing saved) unless --allow-native-segments is
given. Each --calibration-data file is one batch of ``convert(calibration_input_fn=...)`` (INT8, FP8).
Data files are read and checked against the signature's input names, dtypes and shapes (from
saved_model.pb) before converting. Prints the conversion summary.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import sys
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from tftrt_py import settings
from tftrt_py.convert.params import CALIBRATION_ALGORITHMS, quantized
from tftrt_py.engine.types import PRECISIONS
from tftrt_py.tools.cli import ToolError, add_common_flags, one_line, run_tool, shape_str
from tftrt_py.tools.export import load_meta_graph
from tftrt_py.tools.inputs import bind, load_arrays

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
    p.add_argument("--compile-native-loops", action="store_true",
                   help="loops left native (their trip count known only when they run) are compiled by XLA "
                        "(TrtGraphConverterV2(compile_native_loops=True))")
    p.add_argument("--no-summary", dest="summary", action="store_false", help="do not print the summary")
    add_common_flags(p)
    return p


def converter_kwargs(args: argparse.Namespace) -> dict:
    """TrtGraphConverterV2 keyword arguments for parsed flags (dynamic-shape ones only when given)."""
    kwargs = dict(input_saved_model_dir=args.input_dir,
                  input_saved_model_tags=_tags(args),
                  input_saved_model_signature_key=args.signature_key,
                  precision_mode=args.precision_mode, minimum_segment_size=args.minimum_segment_size,
                  max_workspace_size_bytes=args.max_workspace_size_bytes,
                  maximum_cached_engines=args.maximum_cached_engines, use_calibration=args.use_calibration,
                  allow_build_at_runtime=args.allow_build_at_runtime,
                  calibration_algorithm=args.calibration_algorithm,
                  compile_native_loops=args.compile_native_loops)
    if args.use_dynamic_shape:
        kwargs["use_dynamic_shape"] = True
    if args.profile_strategy is not None:
        kwargs["dynamic_shape_profile_strategy"] = args.profile_strategy
    return kwargs


#: A signature input: (numpy dtype name, shape with None for unknown dims, or None for an unknown rank).
Spec = Tuple[str, Optional[Tuple[Optional[int], ...]]]


def _signature_specs(args) -> Dict[str, Spec]:
    """The converted signature's inputs, by name in sorted order (the order positional arrays bind in),
    read from saved_model.pb."""
    import tensorflow as tf

    meta_graph = load_meta_graph(args.input_dir, _tags(args))
    if args.signature_key not in meta_graph.signature_def:
        keys = sorted(k for k in meta_graph.signature_def if not k.startswith("__"))
        raise ToolError(f"SavedModel {args.input_dir!r} has no signature {args.signature_key!r}; available: {keys}")
    specs = {}
    for name, info in sorted(meta_graph.signature_def[args.signature_key].inputs.items()):
        shape = info.tensor_shape
        dims = None if shape.unknown_rank else tuple(d.size if d.size >= 0 else None for d in shape.dim)
        specs[name] = (np.dtype(tf.dtypes.as_dtype(info.dtype).as_numpy_dtype).name, dims)
    return specs


def _items(paths: Sequence[str], flag: str, specs: Dict[str, Spec]) -> List[dict]:
    """One input_fn item per file, as {input name: array}, each array checked against the signature."""
    items = []
    for path in paths:
        feeds = bind(load_arrays(path), list(specs), f"{flag} {path}")
        for name, value in feeds.items():
            dtype, shape = specs[name]
            if shape is not None and (value.ndim != len(shape) or
                                      any(d is not None and d != n for d, n in zip(shape, value.shape))):
                raise ToolError(f"{flag} {path}: input {name!r} has shape {shape_str(value.shape)}; the signature "
                                f"takes {shape_str(shape)}")
            if value.dtype.name != dtype:
                raise ToolError(f"{flag} {path}: input {name!r} has dtype {value.dtype.name}; the signature takes "
                                f"{dtype}")
        items.append(feeds)
    return items


class _Feeder:
    """The input_fn of one flag's files (checked items); knows which file runs, so that an error the converted
    signature raises on it becomes one line naming the flag and the file."""

    def __init__(self, flag: str, paths: Sequence[str], items: List[dict]):
        self.flag, self.paths, self.items, self.running = flag, list(paths), items, None

    def __call__(self):
        for path, item in zip(self.paths, self.items):
            self.running = path
            yield item
        self.running = None

    @contextlib.contextmanager
    def naming_the_file(self):
        try:
            yield
        except Exception as exc:
            if self.running is None:  # not raised while running a file
                raise
            raise ToolError(f"{self.flag} {self.running}: running the converted signature on it failed: "
                            f"{one_line(exc) or type(exc).__name__}") from exc


def _tags(args) -> List[str]:
    return [t.strip() for t in args.tags.split(",") if t.strip()]


def _check_calibration(args) -> None:
    """Calibration data is given exactly when the precision calibrates (converter.convert's rule, in flags)."""
    calibrates = quantized(args.precision_mode) and args.use_calibration
    if calibrates and not args.calibration_data:
        raise ToolError(f"--precision-mode {args.precision_mode} calibrates: give --calibration-data FILE (one "
                        f".npy/.npz batch per flag), or --no-use-calibration if the model's quantization ops "
                        f"give the ranges")
    if args.calibration_data and not calibrates:
        why = "with --no-use-calibration" if quantized(args.precision_mode) else \
            f"with --precision-mode {args.precision_mode}"
        raise ToolError(f"--calibration-data is not used {why}: drop it, or calibrate with --precision-mode INT8 "
                        f"or FP8")


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
    _check_calibration(args)
    specs = _signature_specs(args) if args.build_data or args.calibration_data else {}
    build_items = _items(args.build_data, "--build-data", specs)  # read and checked before the slow part
    calibration_items = _items(args.calibration_data, "--calibration-data", specs)

    from tftrt_py import trt_convert as trt
    from tftrt_py.converters.summary import describe_native_runs
    from tftrt_py.engine_op import dispatcher

    converter = trt.TrtGraphConverterV2(**converter_kwargs(args))
    if calibration_items:
        calibration = _Feeder("--calibration-data", args.calibration_data, calibration_items)
        with calibration.naming_the_file():
            converter.convert(calibration_input_fn=calibration)
    else:
        converter.convert()
    if build_items:
        build = _Feeder("--build-data", args.build_data, build_items)
        with build.naming_the_file():
            converter.build(input_fn=build)
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
    # before TensorFlow allocates: its oneDNN allocator would keep the memory of the SavedModel's load (1x the
    # weights) and of the variables until the process ends; a conversion process is better off without the pool
    settings.ONEDNN_SYSTEM_ALLOCATOR.set_default("1")
    return run_tool(build_parser(), _run, argv)


if __name__ == "__main__":
    sys.exit(main())
