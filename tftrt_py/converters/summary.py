"""The conversion summary: one row per engine op, op histograms, totals, the engine ops running natively for
the shapes built, the non-conversion report."""
from __future__ import annotations

import collections

import numpy as np
import tensorflow as tf

from tftrt_py.convert.build import OUTPUT_PREFIX
from tftrt_py.convert.graph import split_ref
from tftrt_py.convert.rewrite import ENGINE_OP
from tftrt_py.convert.variables import weight_inputs
from tftrt_py.converters.xla_loops import MUST_COMPILE_ATTR
from tftrt_py.engine_op import dispatcher

__all__ = ["print_summary", "engine_op_counts", "weight_feeds", "conversion_ratio", "native_runs", "engine_ratio",
           "describe_native_runs", "xla_loop_counts"]

COLUMNS = [("TRTEngineOP Name", .20), ("Device", .09), ("# Nodes", .05), ("# Inputs", .09), ("# Outputs", .09),
           ("Input DTypes", .12), ("Output Dtypes", .12), ("Input Shapes", .12), ("Output Shapes", .12)]


def _row(fields, positions, print_fn):
    line = ""
    for i, field in enumerate(fields):
        line = (line + " " if i else line) + str(field)
        line = line[:positions[i]].ljust(positions[i])
    print_fn(line.rstrip())


def engine_op_counts(graph_def):
    """Engine op name -> Counter of the op types in its native segment (TF-TRT counts these as converted), and of
    the nodes giving it weights (:func:`weight_feeds`)."""
    functions = {f.signature.name: f for f in graph_def.library.function}
    counts = {}
    for node in graph_def.node:
        if node.op == ENGINE_OP:
            fdef = functions.get(node.attr["segment_func"].func.name)
            nodes = fdef.node_def if fdef is not None else []
            counts[node.name] = collections.Counter(n.op for n in nodes if not n.name.startswith(OUTPUT_PREFIX))
    ops = {n.name: n.op for n in graph_def.node}
    for name, engine in weight_feeds(graph_def).items():
        counts[engine][ops[name]] += 1
    return counts


def weight_feeds(graph_def):
    """Node name -> the engine op it gives weights: the reads of kept variables feeding engine ops' weight
    inputs, and the resource handles only those reads use (convert.variables). They count with the engine, as
    the Consts a frozen graph has in their place do."""
    nodes = {n.name: n for n in graph_def.node}
    users = collections.defaultdict(list)  # node name -> (consumer, input index) of its data outputs
    for node in graph_def.node:
        for i, ref in enumerate(node.input):
            if not ref.startswith("^"):
                users[split_ref(ref)[0]].append((node, i))
    feeds = {}
    for node in graph_def.node:
        for i in weight_inputs(node) if node.op == ENGINE_OP else ():
            stack = [split_ref(node.input[i])[0]]
            while stack:
                name = stack.pop()
                if name in feeds or name not in nodes or not all(
                        user.name in feeds or (user.op == ENGINE_OP and j in weight_inputs(user))
                        for user, j in users[name]):
                    continue
                feeds[name] = node.name
                stack.extend(split_ref(r)[0] for r in nodes[name].input if not r.startswith("^"))
    return feeds


def conversion_ratio(graph_def):
    """(ops inside engines, all ops) as TF-TRT's summary counts them."""
    counts = engine_op_counts(graph_def)
    inside = sum(sum(c.values()) for c in counts.values())
    feeds = weight_feeds(graph_def)
    outside = sum(1 for n in graph_def.node if n.op != ENGINE_OP and n.name not in feeds)
    return inside, inside + outside


def native_runs(graph_def):
    """Engine op name -> {input shapes: why} for the inputs its engines did not serve in this process (so far:
    those of build() and calibration), which ran its native segment (see EngineOp.native)."""
    runs = {}
    for node in graph_def.node:
        op = dispatcher.find(node.attr["segment_key"].s.decode()) if node.op == ENGINE_OP else None
        if op is not None and op.native:
            runs[node.name] = dict(op.native)
    return runs


def engine_ratio(graph_def):
    """(ops of the engine ops that have engines and ran no input natively, all ops): the share of the
    graph's ops that run in engines for the shapes seen so far."""
    native = native_runs(graph_def)
    nodes = {n.name: n for n in graph_def.node}
    inside = 0
    for name, counts in engine_op_counts(graph_def).items():
        op = dispatcher.find(nodes[name].attr["segment_key"].s.decode())
        if op is not None and op.engines() and name not in native:
            inside += sum(counts.values())
    return inside, conversion_ratio(graph_def)[1]


def describe_native_runs(native, op_counts=None):
    """One line per engine op and input shapes of `native` (see native_runs): the op (with its op count from
    `op_counts`, a name -> Counter of engine_op_counts, when given), the shapes and why."""
    return [f"{name}{f' ({sum(op_counts[name].values())} ops)' if op_counts else ''}, input shapes "
            f"{[list(s) for s in shapes]}: {why}"
            for name, runs in sorted(native.items()) for shapes, why in runs.items()]


def _shapes(node, key):
    return [tf.TensorShape(s).as_list() if not s.unknown_rank else None for s in node.attr[key].list.shape]


def _dtypes(node, key):
    return [tf.as_dtype(t).name for t in node.attr[key].list.type]


def print_summary(graph_def, report, line_length, detailed, print_fn, built=False):
    """`built`: build() ran, so the engines of the shapes built exist (or failed) and are reported."""
    positions = np.cumsum([int(line_length * p) for _, p in COLUMNS]).tolist()
    _row([h for h, _ in COLUMNS], positions, print_fn)
    print_fn("=" * line_length)
    counts = engine_op_counts(graph_def)
    nodes = {n.name: n for n in graph_def.node}
    for i, name in enumerate(sorted(counts)):
        node = nodes[name]
        if i:
            print_fn(f"\n{'-' * 40}\n")
        _row([name, node.device.split("/")[-1] or "CPU:0", sum(counts[name].values()),
              len(node.attr["InT"].list.type), len(node.attr["OutT"].list.type), _dtypes(node, "InT"),
              _dtypes(node, "OutT"), _shapes(node, "input_shapes"), _shapes(node, "output_shapes")],
             positions, print_fn)
        if detailed:
            print_fn("")
            for op, n in sorted(counts[name].items()):
                print_fn(f"\t- {op}: {n}x")
    inside, total = conversion_ratio(graph_def)
    print_fn(f"\n{'=' * line_length}")
    print_fn(f"[*] Total number of TensorRT engines: {len(counts)}")
    print_fn(f"[*] % of OPs Converted: {100.0 * inside / max(total, 1):.2f}% [{inside}/{total}]")
    if built:
        _print_native_runs(graph_def, print_fn)
    print_fn("")
    table = report.format().splitlines()[1:] if report is not None else []
    if table:  # the segmenter's table of the nodes left native; counted as above (its own header counts the graph
        # before engine ops took copies of the shape computations they need)
        print_fn(f"[*] OPs left native: {total - inside}, by op type and reason:")
        for line in table:
            print_fn(line)
    loops = xla_loop_counts(graph_def)
    if loops:
        print_fn(f"[*] Native loops compiled by XLA: {len(loops)} (" +
                 ", ".join(f"{name}: {n} nodes" for name, n in sorted(loops.items())) + ")")


def xla_loop_counts(graph_def):
    """Call node name -> the nodes of its function, for the native loops compiled by XLA (converters.xla_loops)."""
    functions = {f.signature.name: f for f in graph_def.library.function}
    return {node.name: len(functions[node.attr["f"].func.name].node_def) for node in graph_def.node
            if MUST_COMPILE_ATTR in node.attr and node.attr[MUST_COMPILE_ATTR].b and "f" in node.attr
            and node.attr["f"].func.name in functions}


def _print_native_runs(graph_def, print_fn):
    running, total = engine_ratio(graph_def)
    print_fn(f"[*] % of OPs running in engines for the shapes built: {100.0 * running / max(total, 1):.2f}% "
             f"[{running}/{total}]")
    native = native_runs(graph_def)
    if native:
        counts = engine_op_counts(graph_def)
        ops = sum(sum(counts.get(name, {}).values()) for name in native)
        print_fn(f"\n[!] {len(native)} engine op(s) ({ops} ops) run their native segment for shapes built:")
        for line in describe_native_runs(native, counts):
            print_fn(f"\t- {line}")
