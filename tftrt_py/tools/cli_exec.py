"""tftrt-exec: time a .plan file or a converted SavedModel on synthetic or given inputs (like trtexec).

    tftrt-exec model_trt --batch 8 --iterations 200 --profile
    tftrt-exec plans/TRTEngineOp_000_000_0.plan --export-json report.json

Latency is host wall-clock time around one synchronous run (execute for a plan, a signature call
whose outputs are read back for a SavedModel): warm-up runs are excluded, then each timed run is
recorded and summarized as min / mean / median / percentiles / max; throughput is timed runs over
the total time of the timed loop, times the batch for samples/s. --profile reports per-layer times
from the engines' Profiler hook, in a separate pass so it does not disturb the timings. A plan
runs without importing TensorFlow.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from tftrt_py.tools.cli import ToolError, add_common_flags, nbytes_str, run_tool, shape_str, short_names, table
from tftrt_py.tools.inputs import InputError, bind, load_arrays, parse_shape_override, synthetic

__all__ = ["build_parser", "latency_summary", "main"]

PERCENTILES = (50, 90, 95, 99)


def _count(low: int):
    def parse(text: str) -> int:
        value = int(text)
        if value < low:
            raise argparse.ArgumentTypeError(f"{text} is less than {low}")
        return value
    return parse


def _shape_flag(text: str):
    try:
        return parse_shape_override(text)
    except InputError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="tftrt-exec", description="Time a .plan file or a converted SavedModel (like trtexec): latency "
                                       "min/mean/median/p99, throughput, optional per-layer profile.",
        epilog="Exit codes: 0 done, 1 the run failed (a message says why), 2 bad arguments.")
    p.add_argument("target", help="a .plan file (from tftrt-export) or a converted SavedModel directory")
    p.add_argument("--warmup", type=_count(0), default=10, help="untimed runs first (default: %(default)s)")
    p.add_argument("--iterations", type=_count(1), default=100, help="timed runs (default: %(default)s)")
    p.add_argument("--batch", type=_count(1), default=None,
                   help="plan: a batch up to the engine's (row-wise engines); SavedModel: the unknown batch "
                        "dimension (default: the engine's batch / 1)")
    p.add_argument("--shapes", type=_shape_flag, action="append", default=[], metavar="NAME:DIMS",
                   help="input shape override, e.g. image:1x32x32x3 (repeatable)")
    p.add_argument("--inputs", metavar="FILE", help=".npy/.npz input arrays (by input name or positional) "
                                                    "instead of synthetic data")
    p.add_argument("--seed", type=int, default=0, help="seed of the synthetic inputs (default: %(default)s)")
    p.add_argument("--profile", action="store_true", help="print per-layer times (name, kind, calls, mean ms, "
                                                          "%% of total)")
    p.add_argument("--export-json", metavar="FILE", help="write the report as JSON")
    p.add_argument("--signature-key", default="serving_default", help="SavedModel signature (default: %(default)s)")
    p.add_argument("--tags", default="serve", help="SavedModel tags, comma-separated (default: %(default)s)")
    p.add_argument("--backend", metavar="NAME", help="plan: the backend that runs it (numpy, onnxruntime or cupy; "
                                                     "default: the one it was built for); SavedModel: set "
                                                     "TFTRT_PY_BACKEND instead")
    add_common_flags(p)
    return p


@dataclasses.dataclass
class Target:
    """What to run: a description, named input specs and the calls the timing loop needs."""

    kind: str
    description: List[Tuple[str, str]]
    specs: List[Tuple[str, str, Tuple[int, ...]]]  # (name, dtype, shape) of each input
    prepare: Callable[[Dict[str, np.ndarray]], Callable[[], None]]  # feeds -> one synchronous run
    profile: Callable[[Callable[[], None], int], List[dict]]  # (run, runs) -> per-layer rows
    stats: Callable[[], dict] = dict


# -- plans (no TensorFlow) -------------------------------------------------------------
def _plan_target(args) -> Target:
    from tftrt_py.engine import Profiler, Runtime

    with open(args.target, "rb") as f:
        engine = Runtime(args.backend).deserialize_cuda_engine(f.read())
    names = [t.name for t in engine.inputs]
    shapes = {t.name: t.shape for t in engine.inputs}
    if args.batch is not None:
        shapes = {n: (args.batch, *s[1:]) if s else s for n, s in shapes.items()}
    shapes.update(_overrides(args, names, "the plan"))
    wanted = [shapes[n] for n in names]
    if not engine.can_serve(wanted):
        built = ", ".join(shape_str(t.shape) for t in engine.inputs)
        rule = (f"it serves batches up to {engine.max_batch_size} with the other dimensions as built"
                if engine.rowwise else "its layers mix rows, so it serves only the shapes it was built for")
        raise ToolError(f"the engine cannot run input shapes ({', '.join(shape_str(s) for s in wanted)}): it was "
                        f"built for ({built}) and {rule}")
    context = engine.create_execution_context()
    weights = engine.weight_bytes
    description = [("Engine", f"{engine.name}: {engine.precision}, {engine.backend_name} backend on "
                              f"{engine.device}, {len(engine.network.layers)} layers, {nbytes_str(weights)} "
                              f"of weights" + (f", row-wise (batch <= {engine.max_batch_size})"
                                               if engine.rowwise else ""))]

    def prepare(feeds):
        return lambda: _on_host(context.execute(feeds))

    def profile(run, runs):
        profiler = Profiler()
        context.profiler = profiler
        try:
            for _ in range(runs):
                run()
        finally:
            context.profiler = None
        return _layer_rows(engine.name, engine.network.layers, profiler.records)

    return Target("plan", description, [(t.name, t.dtype, shapes[t.name]) for t in engine.inputs], prepare, profile)


def _on_host(outputs: Dict[str, object]) -> None:
    """Wait for outputs a device backend returns as device arrays (by copying them to the host)."""
    for value in outputs.values():
        if hasattr(value, "__cuda_array_interface__") and hasattr(value, "get"):
            value.get()


def _overrides(args, names: Sequence[str], what: str) -> Dict[str, Tuple[int, ...]]:
    for name, _ in args.shapes:
        if name not in names:
            raise ToolError(f"--shapes names {name!r}, but {what} has no such input; its inputs: {list(names)}")
    return dict(args.shapes)


def _layer_rows(engine_name: str, layers, records: Dict[str, List[float]]) -> List[dict]:
    rows = []
    for layer in layers:
        times = records.get(layer.name)
        if times:
            rows.append({"engine": engine_name, "name": layer.name, "kind": layer.kind, "calls": len(times),
                         "mean_ms": float(np.mean(times)), "total_ms": float(np.sum(times))})
    return rows


# -- SavedModels -----------------------------------------------------------------------
def _saved_model_target(args) -> Target:
    if not any(os.path.exists(os.path.join(args.target, f)) for f in ("saved_model.pb", "saved_model.pbtxt")):
        raise ToolError(f"{args.target!r} is a directory without saved_model.pb: not a SavedModel")
    from tftrt_py import trt_convert  # noqa: F401  (registers TRTEngineOp before loading)
    import tensorflow as tf

    from tftrt_py.engine import Profiler
    from tftrt_py.engine_op import dispatcher

    tags = [t.strip() for t in args.tags.split(",") if t.strip()]
    try:
        loaded = tf.saved_model.load(args.target, tags=tags)
    except (tf.errors.OpError, ValueError, RuntimeError) as exc:
        raise ToolError(f"cannot load SavedModel {args.target!r} with tags {tags}: {exc}") from None
    if args.signature_key not in loaded.signatures:
        raise ToolError(f"SavedModel {args.target!r} has no signature {args.signature_key!r}; available: "
                        f"{sorted(loaded.signatures)}")
    signature = loaded.signatures[args.signature_key]
    specs = signature.structured_input_signature[1]
    overrides = _overrides(args, list(specs), f"signature {args.signature_key!r}")
    inputs = []
    for name, spec in specs.items():
        shape = overrides.get(name)
        if shape is None:
            if spec.shape.rank is None:
                raise ToolError(f"input {name!r} has an unknown rank; give its shape with --shapes {name}:DIMS")
            shape = spec.shape.as_list()
            if shape and shape[0] is None:
                shape[0] = args.batch or 1
            elif shape and args.batch is not None and shape[0] != args.batch:
                raise ToolError(f"input {name!r} has a fixed batch of {shape[0]}; --batch {args.batch} cannot "
                                f"change it")
            if any(d is None for d in shape):
                raise ToolError(f"input {name!r} has unknown dimensions {shape_str(shape)}; give them with "
                                f"--shapes {name}:DIMS")
        inputs.append((name, np.dtype(spec.dtype.as_numpy_dtype).name, tuple(shape)))

    def prepare(feeds):
        tensors = {name: tf.constant(value) for name, value in feeds.items()}

        def run():
            for value in signature(**tensors).values():
                value.numpy()  # wait for the result
        return run

    def profile(run, runs):
        ops = sorted(dispatcher.engine_ops().values(), key=lambda op: op.name)
        profilers = [Profiler() for _ in ops]
        for op, profiler in zip(ops, profilers):
            op.set_profiler(profiler)
        try:
            for _ in range(runs):
                run()
        finally:
            for op in ops:
                op.set_profiler(None)
        rows = []
        for op, profiler in zip(ops, profilers):
            layers = {layer.name: layer for engine in op.engines() for layer in engine.network.layers}
            rows += _layer_rows(op.name, layers.values(), profiler.records)
        return rows

    description = [("Signature", f"{args.signature_key} ({', '.join(n for n, _, _ in inputs)} -> "
                                 f"{', '.join(signature.structured_outputs)})")]
    return Target("saved_model", description, inputs, prepare, profile, stats=dispatcher.stats)


# -- measuring ---------------------------------------------------------------------------
def latency_summary(latencies_ms: Sequence[float]) -> Dict[str, float]:
    """min, mean, median, p90, p95, p99, max and standard deviation of per-run latencies (ms)."""
    lat = np.asarray(latencies_ms, dtype=np.float64)
    out = {"min": float(lat.min()), "mean": float(lat.mean())}
    out.update({("median" if q == 50 else f"p{q}"): float(np.percentile(lat, q)) for q in PERCENTILES})
    out.update({"max": float(lat.max()), "std": float(lat.std())})
    return out


def _feeds(args, target: Target) -> Tuple[Dict[str, np.ndarray], str]:
    names = [n for n, _, _ in target.specs]
    if not args.inputs:
        return synthetic(target.specs, args.seed), f"synthetic, seed {args.seed}"
    feeds = bind(load_arrays(args.inputs), names)
    for name, dtype, shape in target.specs:
        if feeds[name].dtype.name != dtype:
            raise ToolError(f"input {name!r} in {args.inputs} has dtype {feeds[name].dtype.name}, expected {dtype}")
        if feeds[name].shape != tuple(shape) and (args.batch is not None or name in dict(args.shapes)):
            raise ToolError(f"input {name!r} in {args.inputs} has shape {shape_str(feeds[name].shape)}, but "
                            f"--batch/--shapes ask for {shape_str(shape)}")
    return feeds, args.inputs


def _report(args, target: Target) -> dict:
    feeds, source = _feeds(args, target)
    run = target.prepare(feeds)
    for _ in range(args.warmup):
        run()
    latencies = []
    start = time.perf_counter()
    for _ in range(args.iterations):
        t0 = time.perf_counter()
        run()
        latencies.append((time.perf_counter() - t0) * 1e3)
    total = time.perf_counter() - start
    first = next((v for v in feeds.values() if v.ndim), None)
    batch = int(first.shape[0]) if first is not None else 1
    report = {
        "tool": "tftrt-exec", "target": args.target, "kind": target.kind,
        "description": dict(target.description),
        "inputs": [{"name": n, "dtype": feeds[n].dtype.name, "shape": list(feeds[n].shape), "source": source}
                   for n, _, _ in target.specs],
        "batch": batch, "warmup": args.warmup, "iterations": args.iterations, "total_s": total,
        "latency_ms": latency_summary(latencies),
        "throughput": {"inferences_per_s": args.iterations / total, "samples_per_s": args.iterations * batch / total},
        "latencies_ms": latencies,
    }
    if args.profile:
        rows = target.profile(run, args.iterations)
        layer_total = sum(r["total_ms"] for r in rows)
        for r in rows:
            r["percent"] = 100.0 * r["total_ms"] / layer_total if layer_total else 0.0
        report["profile"] = {"runs": args.iterations, "layers": rows}
    stats = target.stats()
    if stats:
        report["engine_ops"] = stats
    return report


def format_report(report: dict) -> List[str]:
    lat, thr = report["latency_ms"], report["throughput"]
    lines = [f"=== tftrt-exec: {report['target']} ({report['kind'].replace('_', ' ')}) ==="]
    lines += [f"{k}: {v}" for k, v in report["description"].items()]
    lines += [f"Input: {i['name']} {i['dtype']} {shape_str(i['shape'])} ({i['source']})" for i in report["inputs"]]
    lines += ["", "=== Performance summary (host wall-clock per synchronous run) ===",
              f"Runs: {report['warmup']} warm-up (excluded), {report['iterations']} timed in "
              f"{report['total_s']:.3f} s, batch {report['batch']}",
              f"Latency: min = {lat['min']:.3f} ms, mean = {lat['mean']:.3f} ms, median = {lat['median']:.3f} ms, "
              f"p90 = {lat['p90']:.3f} ms, p99 = {lat['p99']:.3f} ms, max = {lat['max']:.3f} ms",
              f"Throughput: {thr['inferences_per_s']:.1f} inferences/s, {thr['samples_per_s']:.1f} samples/s"]
    for name, s in sorted(report.get("engine_ops", {}).items()):
        fallbacks = ", ".join(f"{k} {v}" for k, v in sorted(s["fallbacks"].items())) or "none"
        lines.append(f"Engine op {name}: {s['engines']} engine(s), {s['engine_runs']} engine runs, "
                     f"native-segment runs: {fallbacks}")
    if "profile" in report:
        rows = report["profile"]["layers"]
        multi = len({r["engine"] for r in rows}) > 1
        total = sum(r["mean_ms"] for r in rows)
        scope, names = short_names([r["name"] for r in rows])
        lines += ["", f"=== Per-layer profile ({report['profile']['runs']} runs) ==="]
        if scope:
            lines.append(f"(layer names without their common scope {scope})")
        lines += table(["Layer", "Kind", "Calls", "Mean (ms)", "% of total"],
                       [[(f"{r['engine']}: " if multi else "") + name, r["kind"], r["calls"],
                         f"{r['mean_ms']:.4f}", f"{r['percent']:.1f}"] for r, name in zip(rows, names)]
                       + [["Total", "", "", f"{total:.4f}", "100.0" if rows else "0.0"]], right=(2, 3, 4))
        if not rows:
            lines.append("(no engine layer ran: every engine op ran its native segment)")
    return lines


def _run(args) -> int:
    if os.path.isdir(args.target):
        if args.backend is not None:
            raise ToolError("--backend applies to .plan files; a SavedModel's engine ops run on TFTRT_PY_BACKEND")
        target = _saved_model_target(args)
    elif os.path.isfile(args.target):
        target = _plan_target(args)
    else:
        raise ToolError(f"{args.target!r} does not exist (expected a .plan file or a SavedModel directory)")
    report = _report(args, target)
    print("\n".join(format_report(report)))
    if args.export_json:
        with open(args.export_json, "w") as f:
            json.dump(report, f, indent=2)
        print(f"\nReport written to {args.export_json}")
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    return run_tool(build_parser(), _run, argv)


if __name__ == "__main__":
    sys.exit(main())
