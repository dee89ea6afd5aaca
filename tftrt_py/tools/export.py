"""Engines out of a converted SavedModel: stand-alone .plan files (user guide 2.10), the nodes left
outside the engines, and the converted graph for TensorBoard.

    tftrt-export SAVED_MODEL_DIR OUT_DIR        (or: python -m tftrt_py.tools.export ...)

saved_model.pb is parsed, nothing is run. The graph looked at is the signature's: its top-level
nodes (TF1 SavedModels, where static engines keep their plan in ``serialized_segment``) and the
functions it calls (TF2 SavedModels, whose engines are saved as ``assets/trt-serialized-engine.<engine op>``).
Each engine becomes ``<engine op>_<i>.plan`` with a ``<engine op>_<i>.json`` sidecar naming its
bindings (TensorRTInputPH_i / TensorRTOutputPH_i), dtypes and shapes.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from typing import Callable, Dict, Iterator, List, Optional, Sequence, Tuple

from tftrt_py.tools.cli import ToolError, add_common_flags, run_tool, shape_str

__all__ = ["ExportError", "EngineRecord", "load_meta_graph", "find_engines", "with_default_attrs", "export_plans",
           "excluded_nodes", "converted_graph_def", "write_tensorboard", "main"]

ENGINE_OP = "TRTEngineOp"
#: Node types a fully converted graph keeps around its engines (the seed's "input placeholders, TensorRT
#: engine, and output identity nodes").
PASSTHROUGH_OPS = ("Placeholder", "Identity", "NoOp")


class ExportError(ToolError, ValueError):
    """The SavedModel is missing, has no such signature, or holds no engines to export."""


@dataclasses.dataclass
class EngineRecord:
    """One engine op of the signature's graph and its serialized engines."""

    name: str
    node: object  # NodeDef
    graph: str  # "" for the top-level graph, else the function holding the node
    plans: List[Tuple[str, bytes]]  # (where it came from, plan bytes)


@dataclasses.dataclass
class _Graph:
    name: str  # "" or a function name
    nodes: list  # NodeDefs in graph order; a function's arguments first, as Placeholders
    function: object = None  # the FunctionDef, for a function


# -- reading the SavedModel ---------------------------------------------------------
def load_meta_graph(saved_model_dir: str, tags: Optional[Sequence[str]] = None):
    """The MetaGraphDef of `saved_model_dir` with `tags` (default: the only one, else the 'serve' one)."""
    from google.protobuf import message, text_format
    from tensorflow.core.protobuf import saved_model_pb2

    if not os.path.isdir(saved_model_dir):
        raise ExportError(f"SavedModel directory {saved_model_dir!r} does not exist")
    saved_model = saved_model_pb2.SavedModel()
    pb, pbtxt = (os.path.join(saved_model_dir, f) for f in ("saved_model.pb", "saved_model.pbtxt"))
    try:
        if os.path.exists(pb):
            with open(pb, "rb") as f:
                saved_model.ParseFromString(f.read())
        elif os.path.exists(pbtxt):
            with open(pbtxt) as f:
                text_format.Parse(f.read(), saved_model)
        else:
            raise ExportError(f"{saved_model_dir!r} holds no saved_model.pb: it is not a SavedModel directory")
    except (message.DecodeError, text_format.ParseError, UnicodeDecodeError) as exc:
        raise ExportError(f"cannot parse the SavedModel in {saved_model_dir!r}: {exc}") from None
    graphs = list(saved_model.meta_graphs)
    available = [sorted(m.meta_info_def.tags) for m in graphs]
    if tags:
        graphs = [m for m in graphs if set(m.meta_info_def.tags) == set(tags)]
    elif len(graphs) > 1:
        graphs = [m for m in graphs if "serve" in m.meta_info_def.tags][:1]
    if not graphs:
        raise ExportError(f"SavedModel {saved_model_dir!r} has no MetaGraph with tags {sorted(tags or ['serve'])}; "
                          f"available: {available}")
    return graphs[0]


def _base(ref: str) -> str:
    return ref.lstrip("^").split(":")[0]


def _function_refs(node, skip=("segment_func",)) -> Iterator[str]:
    """Names of the functions a node calls (attrs of type func or list of func)."""
    for key, value in node.attr.items():
        if key in skip:
            continue
        if value.HasField("func"):
            yield value.func.name
        elif value.HasField("list"):
            yield from (f.name for f in value.list.func)


def _signature_graphs(meta_graph, signature_key: str) -> Tuple[_Graph, List[_Graph]]:
    """(top-level nodes the signature's outputs need, the functions they call, transitively)."""
    from tensorflow.core.framework import node_def_pb2

    signatures = meta_graph.signature_def
    if signature_key not in signatures:
        keys = sorted(k for k in signatures if not k.startswith("__"))
        raise ExportError(f"the SavedModel has no signature {signature_key!r}; available: {keys}")
    graph_def = meta_graph.graph_def
    nodes = {n.name: n for n in graph_def.node}
    needed, stack = set(), [_base(t.name) for t in signatures[signature_key].outputs.values()]
    while stack:
        name = stack.pop()
        if name in needed or name not in nodes:
            continue
        needed.add(name)
        stack.extend(_base(r) for r in nodes[name].input)
    top = _Graph("", [n for n in graph_def.node if n.name in needed])
    library = {f.signature.name: f for f in graph_def.library.function}
    called, seen = [], set()
    queue = [f for n in top.nodes for f in _function_refs(n)]
    while queue:
        name = queue.pop(0)
        if name in seen or name not in library:
            continue
        seen.add(name)
        fdef = library[name]
        args = []
        for arg in fdef.signature.input_arg:
            arg_node = node_def_pb2.NodeDef(name=arg.name, op="Placeholder")
            arg_node.attr["dtype"].type = arg.type
            args.append(arg_node)
        called.append(_Graph(name, args + list(fdef.node_def), fdef))
        queue.extend(f for n in fdef.node_def for f in _function_refs(n))
    return top, called


def _engine_graphs(meta_graph, signature_key: str) -> List[_Graph]:
    """The graphs holding engine ops; with none, the innermost graph that wrappers call."""
    top, called = _signature_graphs(meta_graph, signature_key)
    with_engines = [g for g in [top] + called if any(n.op == ENGINE_OP for n in g.nodes)]
    if with_engines:
        return with_engines
    by_name, graph = {g.name: g for g in called}, top
    while True:  # unwrap signature wrappers: a graph whose only call leads to the model's function
        calls = [f for n in graph.nodes for f in _function_refs(n)]
        if len(calls) != 1 or calls[0] not in by_name:
            return [graph]
        graph = by_name[calls[0]]


def _asset_inputs(graph: _Graph) -> set:
    """Names of the Placeholders/arguments that only feed engine ops their saved-engine asset paths."""
    names = set()
    for node in graph.nodes:
        if node.op == ENGINE_OP:
            data = [r for r in node.input if not r.startswith("^")]
            names.update(_base(r) for r in data[len(node.attr["InT"].list.type):])
    return names


def find_engines(saved_model_dir: str, signature_key: str = "serving_default",
                 tags: Optional[Sequence[str]] = None) -> List[EngineRecord]:
    """Every engine op of the signature's graph with its plans: a static engine's ``serialized_segment``
    first, then the engines saved in ``assets/trt-serialized-engine.<engine op>``."""
    from tftrt_py.engine import PlanError
    from tftrt_py.engine_op.cache import engine_asset_name, unpack_plans

    records: Dict[str, EngineRecord] = {}
    for graph in _engine_graphs(load_meta_graph(saved_model_dir, tags), signature_key):
        for node in graph.nodes:
            if node.op != ENGINE_OP or node.name in records:
                continue
            plans = []
            static = node.attr["serialized_segment"].s if "serialized_segment" in node.attr else b""
            if static:
                plans.append(("serialized_segment", static))
            asset = os.path.join("assets", engine_asset_name(node.name))
            path = os.path.join(saved_model_dir, asset)
            if os.path.isfile(path):
                with open(path, "rb") as f:
                    try:
                        plans += [(asset, p) for p in unpack_plans(f.read())]
                    except PlanError as exc:
                        raise ExportError(f"{path}: {exc}") from None
            records[node.name] = EngineRecord(node.name, node, graph.name, plans)
    return list(records.values())


def with_default_attrs(node):
    """A copy of an engine op NodeDef with the attrs SavedModel saving stripped (those equal to the op's
    defaults) filled back in."""
    from tensorflow.python.framework import op_def_registry

    from tftrt_py.engine_op import library

    library.load()
    out = type(node)()
    out.CopyFrom(node)
    for attr in op_def_registry.get(node.op).attr:
        if attr.name not in out.attr and attr.HasField("default_value"):
            out.attr[attr.name].CopyFrom(attr.default_value)
    return out


# -- the user guide's loop ----------------------------------------------------------
def excluded_nodes(saved_model_dir: str, signature_key: str = "serving_default",
                   tags: Optional[Sequence[str]] = None,
                   print_fn: Optional[Callable[[str], None]] = None) -> List[Tuple[str, str]]:
    """(op, name) of every node outside the engines; with `print_fn`, every node printed as the user
    guide's script does ("Node: TRTEngineOp, <name>" / "Exclude Node: <op>, <name>").

    The engines' asset-path inputs are left out: they belong to the engine ops.
    """
    excluded = []
    for graph in _engine_graphs(load_meta_graph(saved_model_dir, tags), signature_key):
        assets = _asset_inputs(graph)
        for node in graph.nodes:
            name = node.name.replace("/", "_")
            if node.op == ENGINE_OP:
                if print_fn:
                    print_fn(f"Node: {node.op}, {name}")
            elif not (node.op == "Placeholder" and node.name in assets):
                excluded.append((node.op, node.name))
                if print_fn:
                    print_fn(f"Exclude Node: {node.op}, {name}")
    return excluded


def _describe(plan: bytes, record: EngineRecord, index: int, source: str) -> dict:
    from tftrt_py.engine import PlanError, Runtime

    try:
        engine = Runtime().deserialize_cuda_engine(plan)
    except PlanError as exc:
        raise ExportError(f"engine {index} of {record.name} (from {source}) is not a valid plan: {exc}") from None
    bindings = lambda tensors: [{"name": t.name, "dtype": t.dtype, "shape": list(t.shape)} for t in tensors]
    tf_shapes = [None if s.unknown_rank else [d.size for d in s.dim]
                 for s in record.node.attr["input_shapes"].list.shape]
    return {"engine_op": record.name, "index": index, "source": source, "precision": engine.precision,
            "rowwise": engine.rowwise, "inputs": bindings(engine.inputs), "outputs": bindings(engine.outputs),
            "tf_inputs": [r for r in record.node.input if not r.startswith("^")][:len(tf_shapes)],
            "tf_input_shapes": tf_shapes, "plan_bytes": len(plan)}


def export_plans(saved_model_dir: str, out_dir: str, signature_key: str = "serving_default",
                 tags: Optional[Sequence[str]] = None, overwrite: bool = False) -> List[str]:
    """Write every engine of the converted SavedModel as ``<engine op>_<i>.plan`` (plus a ``.json``
    sidecar with its bindings) into `out_dir`; returns the .plan paths. Files already there are replaced only
    with `overwrite`; otherwise nothing is written."""
    records = find_engines(saved_model_dir, signature_key, tags)
    if not records:
        raise ExportError(f"signature {signature_key!r} of {saved_model_dir!r} has no {ENGINE_OP} nodes: "
                          f"convert the model first")
    if not any(r.plans for r in records):
        raise ExportError(f"the engine ops {[r.name for r in records]} hold no engines: build them before saving "
                          f"(converter.build(input_fn) or tftrt-convert --build-data) or convert in static mode")
    files = []  # (path without suffix, plan, sidecar)
    for record in records:
        for i, (source, plan) in enumerate(record.plans):
            base = os.path.join(out_dir, f"{record.name.replace('/', '_')}_{i}")
            files.append((base, plan, dict(_describe(plan, record, i, source), plan=os.path.basename(base) + ".plan")))
    existing = [path for base, _, _ in files for path in (base + ".plan", base + ".json") if os.path.lexists(path)]
    if existing and not overwrite:
        what = f"{existing[0]} already exists" if len(existing) == 1 else \
            f"{existing[0]} and {len(existing) - 1} more file(s) already exist"
        raise ExportError(f"{what}: pass --overwrite (overwrite=True) to replace, or choose another output directory")
    os.makedirs(out_dir, exist_ok=True)
    for base, plan, info in files:
        with open(base + ".plan", "wb") as f:
            f.write(plan)
        with open(base + ".json", "w") as f:
            json.dump(info, f, indent=2)
    return [base + ".plan" for base, _, _ in files]


# -- TensorBoard ---------------------------------------------------------------------
def converted_graph_def(saved_model_dir: str, signature_key: str = "serving_default",
                        tags: Optional[Sequence[str]] = None):
    """The signature's converted graph as one GraphDef (engine ops, the nodes around them) whose library
    holds the native segment functions, for TensorBoard."""
    import tensorflow as tf
    from tensorflow.core.framework import graph_pb2
    from tensorflow.python.framework import function_def_to_graph

    from tftrt_py.engine_op import library

    library.load()  # function_def_to_graph_def looks TRTEngineOp up in the op registry
    meta_graph = load_meta_graph(saved_model_dir, tags)
    graphs = _engine_graphs(meta_graph, signature_key)
    out = graph_pb2.GraphDef()
    out.versions.CopyFrom(meta_graph.graph_def.versions)
    functions = tf.Graph()  # function_def_to_graph_def finds called functions in the default graph
    with functions.as_default():
        tf.graph_util.import_graph_def(graph_pb2.GraphDef(library=meta_graph.graph_def.library), name="")
    for graph in graphs:
        if graph.function is None:
            out.node.extend(graph.nodes)
        else:
            prefix = f"{graph.function.signature.name}/" if len(graphs) > 1 else ""
            with functions.as_default():
                graph_def, _ = function_def_to_graph.function_def_to_graph_def(graph.function,
                                                                             include_library_functions=False)
            for node in graph_def.node:
                new = out.node.add()
                new.CopyFrom(node)
                new.name = prefix + node.name
                del new.input[:]
                new.input.extend(("^" if r.startswith("^") else "") + prefix + r.lstrip("^") for r in node.input)
    library = {f.signature.name: f for f in meta_graph.graph_def.library.function}
    wanted, queue = set(), [f for n in out.node for f in _function_refs(n, skip=())]
    while queue:
        name = queue.pop()
        if name in wanted or name not in library:
            continue
        wanted.add(name)
        queue.extend(f for n in library[name].node_def for f in _function_refs(n, skip=()))
    out.library.function.extend(library[name] for name in sorted(wanted))
    return out


def write_tensorboard(graph_def, logdir: str) -> str:
    """Write `graph_def` as a TensorBoard event file in `logdir`; returns the file's path."""
    import tensorflow as tf

    os.makedirs(logdir, exist_ok=True)
    before = set(os.listdir(logdir))
    writer = tf.summary.create_file_writer(logdir)
    with writer.as_default():
        tf.summary.graph(graph_def)
    writer.close()
    (name,) = sorted(set(os.listdir(logdir)) - before)[-1:]
    return os.path.join(logdir, name)


# -- tftrt-export ------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tftrt-export", description="Write the engines of a converted SavedModel as stand-alone .plan files "
                                         "(user guide 2.10) and list the nodes left outside the engines.")
    parser.add_argument("saved_model_dir", help="a SavedModel converted by tftrt-convert / TrtGraphConverterV2")
    parser.add_argument("out_dir", help="folder for <engine op>_<i>.plan and .json files")
    parser.add_argument("--signature-key", default="serving_default")
    parser.add_argument("--tags", default=None, help="comma-separated MetaGraph tags (default: serve)")
    parser.add_argument("--overwrite", action="store_true", help="replace .plan and .json files already in out_dir")
    add_common_flags(parser)
    return parser


def _run(args) -> int:
    tags = args.tags.split(",") if args.tags else None
    outside = excluded_nodes(args.saved_model_dir, args.signature_key, tags, print_fn=print)
    paths = export_plans(args.saved_model_dir, args.out_dir, args.signature_key, tags, overwrite=args.overwrite)
    print(f"\nWrote {len(paths)} plan(s) to {args.out_dir}:")
    for path in paths:
        with open(path[:-len(".plan")] + ".json") as f:
            info = json.load(f)
        ins = ", ".join(f"{b['name']} {b['dtype']} {shape_str(b['shape'])}" for b in info["inputs"])
        outs = ", ".join(f"{b['name']} {b['dtype']} {shape_str(b['shape'])}" for b in info["outputs"])
        print(f"  {os.path.basename(path)}  [{info['source']}, {info['precision']}]  {ins} -> {outs}")
    others = sorted({op for op, _ in outside if op not in PASSTHROUGH_OPS})
    if others:
        print(f"\nNote: nodes of types {others} stay outside the engines, so the plans do not cover the whole model.")
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    return run_tool(build_parser(), _run, argv)


if __name__ == "__main__":
    sys.exit(main())
