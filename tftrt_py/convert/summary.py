"""The conversion summary: one row per engine op, op histograms, totals, the non-conversion report."""
from __future__ import annotations

import collections

import numpy as np
import tensorflow as tf

from tftrt_py.convert.build import OUTPUT_PREFIX
from tftrt_py.convert.rewrite import ENGINE_OP

__all__ = ["print_summary", "engine_op_counts", "conversion_ratio"]

COLUMNS = [("TRTEngineOP Name", .20), ("Device", .09), ("# Nodes", .05), ("# Inputs", .09), ("# Outputs", .09),
           ("Input DTypes", .12), ("Output Dtypes", .12), ("Input Shapes", .12), ("Output Shapes", .12)]


def _row(fields, positions, print_fn):
    line = ""
    for i, field in enumerate(fields):
        line = (line + " " if i else line) + str(field)
        line = line[:positions[i]].ljust(positions[i])
    print_fn(line.rstrip())


def engine_op_counts(graph_def):
    """Engine op name -> Counter of the op types in its native segment (TF-TRT counts these as converted)."""
    functions = {f.signature.name: f for f in graph_def.library.function}
    counts = {}
    for node in graph_def.node:
        if node.op == ENGINE_OP:
            fdef = functions.get(node.attr["segment_func"].func.name)
            nodes = fdef.node_def if fdef is not None else []
            counts[node.name] = collections.Counter(n.op for n in nodes if not n.name.startswith(OUTPUT_PREFIX))
    return counts


def conversion_ratio(graph_def):
    """(ops inside engines, all ops) as TF-TRT's summary counts them."""
    counts = engine_op_counts(graph_def)
    inside = sum(sum(c.values()) for c in counts.values())
    outside = sum(1 for n in graph_def.node if n.op != ENGINE_OP)
    return inside, inside + outside


def _shapes(node, key):
    return [tf.TensorShape(s).as_list() if not s.unknown_rank else None for s in node.attr[key].list.shape]


def _dtypes(node, key):
    return [tf.as_dtype(t).name for t in node.attr[key].list.type]


def print_summary(graph_def, report, line_length, detailed, print_fn):
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
    print_fn(f"[*] % of OPs Converted: {100.0 * inside / max(total, 1):.2f}% [{inside}/{total}]\n")
    if report is not None:
        for line in report.format().splitlines():
            print_fn(line)
