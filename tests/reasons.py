"""Test helpers: why a converter refuses a node, and what segmentation leaves native."""
import tensorflow as tf

from support import frozen_graph_def
from tftrt_py.convert.context import ValidationContext
from tftrt_py.convert.graph import GraphView
from tftrt_py.convert.ops import get_converter
from tftrt_py.converters import graph_io
from tftrt_py.segmenter import segment_graph

#: Graph plumbing left out of native_ops: inputs, constants, and the NoOp (with the Identity waiting on it) that
#: Keras layers traced in a tf.function add for control dependencies (grappler prunes them from SavedModels).
PLUMBING = ("Placeholder", "Const", "NoOp")


def check(fn, specs, op):
    """The reason the converter gives for the first `op` node of `fn` traced with `specs` (None: accepted)."""
    view = GraphView(frozen_graph_def(fn, specs)[0])
    node = next(n for n in view.nodes.values() if n.op == op)
    return get_converter(op).check(node, ValidationContext(view))


def segmentation(fn, specs, minimum_segment_size=1, grappler=False):
    """segment_graph over the frozen graph of `fn` traced with `specs`, fetching its outputs;
    `grappler`: after the constant folding and pruning TrtGraphConverterV2 runs first."""
    graph_def, inputs, outputs = frozen_graph_def(fn, specs)
    if grappler:
        graph = tf.Graph()
        with graph.as_default():
            tf.graph_util.import_graph_def(graph_def, name="")
        graph_def = graph_io.optimize(graph_def, graph, [f"{n}:0" for n in inputs] + outputs)
    return segment_graph(graph_def, minimum_segment_size=minimum_segment_size, fetches=outputs)


def native_ops(fn, specs, minimum_segment_size=1, grappler=False):
    """{op type: {reason: count}} of the nodes of `fn` that stay native, plumbing left out."""
    result = segmentation(fn, specs, minimum_segment_size, grappler)
    view, reasons = result.view, {}
    native = result.report.node_reasons
    for name, (op, reason) in native.items():
        control_only = op == "Identity" and view.nodes[name].control_inputs
        # a frozen variable's Identity, copied into the engines, stays in the graph for the NoOp waiting on it
        waited_on = op == "Identity" and all(view.nodes[u].op in PLUMBING for u in view.consumers[name] if u in native)
        if op not in PLUMBING and not control_only and not waited_on:
            reasons.setdefault(op, {}).setdefault(reason, 0)
            reasons[op][reason] += 1
    return reasons
