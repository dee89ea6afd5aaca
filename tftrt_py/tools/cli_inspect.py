"""tftrt-inspect: what the engines of a .plan file or a converted SavedModel are made of.

    tftrt-inspect plans/TRTEngineOp_000_000_0.plan
    tftrt-inspect model_trt --tensorboard logs/model_trt      # then: tensorboard --logdir logs/model_trt

For each engine: bindings, precision, backend, build config, weight bytes and its layers after
fusion (Engine.inspect()) with their precision, tactic and weights. For a SavedModel also each
engine op's attributes, native segment, calibration table and the nodes left outside the
engines. --tensorboard writes the converted graph (engine ops; native segments in its function
library) as a TensorBoard event file (user guide 4.1.2.1). A plan is read without TensorFlow.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from typing import List, Optional, Sequence

from tftrt_py.tools.cli import ToolError, add_common_flags, nbytes_str, run_tool, shape_str, short_names, table

__all__ = ["build_parser", "describe_engine", "main"]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="tftrt-inspect", description="Show the engines of a .plan file or a converted SavedModel: layers "
                                          "after fusion, precision, tactics, weights, calibration tables.",
        epilog="Exit codes: 0 done, 1 failed (a message says why), 2 bad arguments.")
    p.add_argument("target", help="a .plan file or a converted SavedModel directory")
    p.add_argument("--json", action="store_true", help="print the description as JSON")
    p.add_argument("--no-layers", dest="layers", action="store_false", help="leave out the layer tables")
    p.add_argument("--tensorboard", metavar="DIR", help="SavedModel: write the converted graph as a TensorBoard "
                                                        "event file in DIR")
    p.add_argument("--signature-key", default="serving_default", help="SavedModel signature (default: %(default)s)")
    p.add_argument("--tags", default=None, help="SavedModel tags, comma-separated (default: serve)")
    add_common_flags(p)
    return p


# -- description (no TensorFlow) --------------------------------------------------------
def _layer_row(engine, row: dict) -> dict:
    """Engine.inspect()'s row plus the layer's weight bytes and tactic."""
    layer = next((l for l in engine.network.layers if l.name == row.get("name")), None)
    extra = {}
    if layer is not None:
        extra["weight_bytes"] = sum(int(w.nbytes) for w in layer.weights.values())
        if layer.name in engine.tactics:
            extra["tactic"] = engine.tactics[layer.name]
    return {**row, **extra}


def describe_engine(engine, source: str = "") -> dict:
    """A JSON-able description of an engine: bindings, build metadata and layers after fusion."""
    binding = lambda t, kind: {"binding": kind, "name": t.name, "dtype": t.dtype, "shape": list(t.shape)}
    layer_names = {l.name for l in engine.network.layers}
    tactics = {k: v for k, v in engine.tactics.items() if k not in layer_names}
    kinds = {}
    for layer in engine.network.layers:
        kinds[layer.kind] = kinds.get(layer.kind, 0) + 1
    return {"name": engine.name, "source": source, "precision": engine.precision, "backend": engine.backend_name,
            "device": engine.device, "rowwise": engine.rowwise, "max_batch_size": engine.max_batch_size,
            "bindings": [binding(t, "input") for t in engine.inputs] + [binding(t, "output") for t in engine.outputs],
            "weight_bytes": int(engine.weight_bytes), "build_config": engine.build_config,
            "tactics": tactics, "layer_kinds": kinds,
            "layers": [_layer_row(engine, row) for row in engine.inspect()]}


def _cell(value) -> str:
    if isinstance(value, list) and all(isinstance(v, list) for v in value):
        return " ".join(shape_str(v) for v in value) or "-"
    if isinstance(value, (dict, list)):
        return json.dumps(value, separators=(",", ":"))
    return "-" if value is None else str(value)


def format_engine(info: dict, layers: bool = True, indent: str = "") -> List[str]:
    lines = [f"Engine {info['name']}" + (f" (from {info['source']})" if info["source"] else ""),
             f"  Precision: {info['precision']}   backend: {info['backend']} on {info['device']}   "
             f"weights: {nbytes_str(info['weight_bytes'])}   layers: {len(info['layers'])} "
             f"({', '.join(f'{k} {n}' for k, n in sorted(info['layer_kinds'].items()))})",
             "  Batch: " + (f"row-wise, serves batches up to {info['max_batch_size']}" if info["rowwise"]
                            else "serves only its build shapes (layers mix rows)"),
             f"  Build config: {json.dumps(info['build_config'], sort_keys=True)}",
             f"  Tactics: {json.dumps(info['tactics'], sort_keys=True) if info['tactics'] else 'none recorded'}",
             "  Bindings:"]
    lines += ["    " + l for l in table(["Binding", "Name", "Dtype", "Shape"],
                                         [[b["binding"], b["name"], b["dtype"], shape_str(b["shape"])]
                                          for b in info["bindings"]])]
    if layers:
        rows = info["layers"]
        keys = [k for k in ("kind", "precision", "inputs", "outputs") if any(k in r for r in rows)]
        keys += [k for r in rows for k in r if k not in keys and k not in ("name", "weight_bytes")]
        keys = list(dict.fromkeys(keys)) + ["weight_bytes"]
        scope, names = short_names([r["name"] for r in rows])
        lines.append("  Layers after fusion" + (f" (names without their common scope {scope}):" if scope else ":"))
        headers = ["#", "Layer"] + [{"weight_bytes": "Weights", "inputs": "Input shapes",
                                     "outputs": "Output shapes"}.get(k, k.capitalize()) for k in keys]
        body = [[i, name] + [nbytes_str(r[k]) if k == "weight_bytes" and k in r else _cell(r.get(k)) for k in keys]
                for i, (r, name) in enumerate(zip(rows, names))]
        lines += ["    " + l for l in table(headers, body, right=(0, len(headers) - 1))]
    return [indent + l for l in lines]


def _inspect_plan(path: str) -> dict:
    from tftrt_py.engine import Runtime, plan

    with open(path, "rb") as f:
        data = f.read()
    engine = Runtime().deserialize_cuda_engine(data)
    return {"kind": "plan", "target": path, "plan_bytes": len(data), "format_version": plan.FORMAT_VERSION,
            "engines": [describe_engine(engine, os.path.basename(path))]}


# -- SavedModels ------------------------------------------------------------------------
def _attr_value(value):
    kind = value.WhichOneof("value")
    if kind == "s":
        return value.s.decode(errors="replace") if len(value.s) < 200 else f"<{len(value.s)} bytes>"
    if kind in ("i", "b", "f"):
        return getattr(value, kind)
    if kind == "func":
        return value.func.name
    if kind == "list":
        if value.list.shape:
            return [None if s.unknown_rank else [d.size for d in s.dim] for s in value.list.shape]
        if value.list.type:
            from tensorflow.python.framework import dtypes

            return [dtypes.as_dtype(t).name for t in value.list.type]
        return []
    if kind == "type":
        from tensorflow.python.framework import dtypes

        return dtypes.as_dtype(value.type).name
    return None


ATTRS = ("precision_mode", "static_engine", "max_cached_engines_count", "max_batch_size", "workspace_size_bytes",
         "use_calibration", "profile_strategy", "input_shapes", "output_shapes", "InT", "OutT",
         "segment_func")


def _calibration(data: bytes):
    """The calibration table: text/JSON as such, anything else as its size."""
    if not data:
        return None
    try:
        text = data.decode()
    except UnicodeDecodeError:
        return f"<{len(data)} bytes of binary data>"
    try:
        return json.loads(text)
    except ValueError:
        return text


def _inspect_saved_model(args) -> dict:
    from tftrt_py.convert.rewrite import ALLOW_BUILD_ATTR
    from tftrt_py.engine import Runtime
    from tftrt_py.tools import export

    tags = args.tags.split(",") if args.tags else None
    records = export.find_engines(args.target, args.signature_key, tags)
    meta_graph = export.load_meta_graph(args.target, tags)
    functions = {f.signature.name: f for f in meta_graph.graph_def.library.function}
    ops = []
    for record in records:
        node = export.with_default_attrs(record.node)
        attrs = {k: _attr_value(node.attr[k]) for k in ATTRS if k in node.attr}
        attrs["allow_build_at_runtime"] = node.attr[ALLOW_BUILD_ATTR].b if ALLOW_BUILD_ATTR in node.attr else True
        segment = functions.get(attrs.get("segment_func", ""))
        histogram = {}
        for member in segment.node_def if segment is not None else []:
            histogram[member.op] = histogram.get(member.op, 0) + 1
        ops.append({"name": record.name, "graph": record.graph or "(top level)", "attrs": attrs,
                    "native_segment": {"function": attrs.get("segment_func"), "ops": histogram},
                    "calibration_table": _calibration(node.attr["calibration_data"].s),
                    "engines": [describe_engine(Runtime().deserialize_cuda_engine(plan), source)
                                for source, plan in record.plans]})
    outside = export.excluded_nodes(args.target, args.signature_key, tags)
    report = {"kind": "saved_model", "target": args.target, "signature": args.signature_key, "engine_ops": ops,
              "outside_engines": [{"op": op, "name": name} for op, name in outside]}
    if args.tensorboard:
        graph_def = export.converted_graph_def(args.target, args.signature_key, tags)
        report["tensorboard"] = {"logdir": args.tensorboard,
                                 "event_file": export.write_tensorboard(graph_def, args.tensorboard),
                                 "nodes": len(graph_def.node), "functions": len(graph_def.library.function)}
    return report


def _typed_shapes(attrs: dict, types: str, shapes: str) -> str:
    return ", ".join(f"{t} {shape_str(s)}" for t, s in zip(attrs.get(types, []), attrs.get(shapes, [])))


def format_report(report: dict, layers: bool = True) -> List[str]:
    if report["kind"] == "plan":
        lines = [f"Plan {report['target']}: {nbytes_str(report['plan_bytes'])}, format version "
                 f"{report['format_version']}"]
        return lines + format_engine(report["engines"][0], layers)
    ops = report["engine_ops"]
    lines = [f"SavedModel {report['target']}, signature {report['signature']}: {len(ops)} engine op(s)"]
    for op in ops:
        a = op["attrs"]
        lines += ["", f"== {op['name']} (in {op['graph']}) ==",
                  f"Precision mode: {a.get('precision_mode')}   static engine: {a.get('static_engine')}   "
                  f"max cached engines: {a.get('max_cached_engines_count')}   allow build at runtime: "
                  f"{a.get('allow_build_at_runtime')}   workspace: {nbytes_str(a.get('workspace_size_bytes') or 0)}",
                  f"Inputs: {_typed_shapes(a, 'InT', 'input_shapes')}   outputs: "
                  f"{_typed_shapes(a, 'OutT', 'output_shapes')}",
                  f"Native segment: {op['native_segment']['function']} "
                  f"({', '.join(f'{k} {n}' for k, n in sorted(op['native_segment']['ops'].items()))})"]
        table_ = op["calibration_table"]
        if table_ is None:
            lines.append("Calibration table: none")
        elif isinstance(table_, dict):
            lines.append(f"Calibration table ({len(table_)} entries):")
            lines += [f"  {k}: {v}" for k, v in sorted(table_.items())]
        else:
            lines.append(f"Calibration table: {table_}")
        lines.append(f"Engines: {len(op['engines'])}" + ("" if op["engines"] else
                                                          " (none saved: they get built at run time)"))
        for info in op["engines"]:
            lines += format_engine(info, layers, indent="  ")
    outside = report["outside_engines"]
    lines += ["", f"Nodes outside the engines: {len(outside)}"]
    lines += [f"  Exclude Node: {n['op']}, {n['name']}" for n in outside]
    if "tensorboard" in report:
        tb = report["tensorboard"]
        lines += ["", f"TensorBoard graph ({tb['nodes']} nodes, {tb['functions']} functions) written to "
                      f"{tb['event_file']}", f"View it with: tensorboard --logdir {tb['logdir']}"]
    return lines


def _run(args) -> int:
    if os.path.isdir(args.target):
        report = _inspect_saved_model(args)
    elif os.path.isfile(args.target):
        if args.tensorboard:
            raise ToolError("--tensorboard needs a SavedModel: a plan holds no TensorFlow graph")
        report = _inspect_plan(args.target)
    else:
        raise ToolError(f"{args.target!r} does not exist (expected a .plan file or a SavedModel directory)")
    print(json.dumps(report, indent=2) if args.json else "\n".join(format_report(report, args.layers)))
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    return run_tool(build_parser(), _run, argv)


if __name__ == "__main__":
    sys.exit(main())
