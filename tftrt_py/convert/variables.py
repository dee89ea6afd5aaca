"""Conversion without graph freezing (TF-TRT's ``TF_TRT_EXPERIMENTAL_FEATURES=disable_graph_freezing``).

The signature's variables stay variables: each read of a captured variable (ReadVariableOp) stays native and
its value enters the engine ops that use it as an ordinary input, marked in the engine op's WEIGHT_INPUTS_ATTR.
The segmenter sees those reads as constants of the variables' values (:class:`WeightsView`), so converters
needing weights accept them; an engine takes the values as weights when it is built (:func:`bind_weights`:
the converter binds the variables' values at build(); a loaded op binds the first values it runs with).
As in TF-TRT, engines keep the values they were built with: assigning a variable later changes what the
native ops compute, not the engines.
"""
from __future__ import annotations

import dataclasses
from typing import Dict, List, Mapping, Sequence

import numpy as np
import tensorflow as tf

from tftrt_py import settings
from tftrt_py.convert.graph import GraphView, split_ref, tensor_ref
from tftrt_py.convert.rewrite import ENGINE_OP

__all__ = ["EXPERIMENTAL_FEATURES_ENV", "DISABLE_GRAPH_FREEZING", "WEIGHT_INPUTS_ATTR",
           "is_experimental_feature_activated", "captured_variables", "variable_reads", "WeightsView",
           "reads_as_inputs", "mark_weight_inputs", "weight_inputs", "bind_weights"]

#: TF-TRT's switch: comma-separated names of experimental features to turn on.
EXPERIMENTAL_FEATURES_ENV = settings.EXPERIMENTAL_FEATURES.name
DISABLE_GRAPH_FREEZING = "disable_graph_freezing"
#: Our (unregistered) engine op attr: the indices of the inputs that are variable values, taken as weights.
WEIGHT_INPUTS_ATTR = "_tftrt_weight_inputs"

#: Ops passing a resource handle on unchanged (function inlining turns arguments into Identities).
_HANDLE_PASS_THROUGH = ("Identity",)


def is_experimental_feature_activated(feature_name: str) -> bool:
    """Whether `feature_name` is listed in TF_TRT_EXPERIMENTAL_FEATURES now (TF-TRT's utils function)."""
    return feature_name in settings.EXPERIMENTAL_FEATURES.get()


def captured_variables(func) -> Dict[str, tf.Variable]:
    """Placeholder name in `func`'s graph -> the variable whose handle it captures."""
    by_handle = {id(v.handle): v for v in func.variables}
    return {internal.op.name: by_handle[id(external)] for external, internal in func.graph.captures
            if id(external) in by_handle}


def variable_reads(graph_def, captured: Mapping[str, tf.Variable]) -> Dict[str, tf.Variable]:
    """ReadVariableOp node name -> the captured variable it reads (through Identities of the handle)."""
    nodes = {n.name: n for n in graph_def.node}

    def source(ref):
        node = nodes.get(split_ref(ref)[0])
        while node is not None and node.op in _HANDLE_PASS_THROUGH and node.input:
            node = nodes.get(split_ref(node.input[0])[0])
        return None if node is None else node.name

    reads = {n.name: captured.get(source(n.input[0])) for n in graph_def.node if n.op == "ReadVariableOp"}
    return {name: v for name, v in reads.items() if v is not None}


class WeightsView(GraphView):
    """The graph as the segmenter sees it: each variable read a Const holding the variable's value now.

    The Consts' protos carry dtype and shape only (no copy of the weights; no 2 GB GraphDef limit); their
    values come from the variables.
    """

    def __init__(self, graph_def, reads: Mapping[str, tf.Variable]):
        self.values = {name: v.numpy() for name, v in reads.items()}
        view = type(graph_def)()
        view.CopyFrom(graph_def)
        for node in view.node:
            if node.name in self.values:
                value = self.values[node.name]
                node.op = "Const"
                node.input[:] = [r for r in node.input if r.startswith("^")]
                node.attr.clear()
                node.attr["dtype"].type = tf.as_dtype(value.dtype).as_datatype_enum
                node.attr["value"].tensor.dtype = node.attr["dtype"].type
                node.attr["value"].tensor.tensor_shape.CopyFrom(tf.TensorShape(value.shape).as_proto())
        super().__init__(view)

    def const_value(self, ref: str):
        name, port = split_ref(ref)
        return self.values[name] if name in self.values and port == 0 else super().const_value(ref)


def reads_as_inputs(segments: Sequence, reads: Mapping[str, object]) -> List:
    """`segments` with the variable reads they copied in (as Consts of :class:`WeightsView`) made inputs."""
    out = []
    for seg in segments:
        moved = [tensor_ref(name) for name in seg.copied_nodes if name in reads]
        out.append(dataclasses.replace(seg, inputs=seg.inputs + moved,
                                       copied_nodes=[n for n in seg.copied_nodes if n not in reads]))
    return out


def mark_weight_inputs(graph_def, reads: Mapping[str, object]) -> None:
    """Set WEIGHT_INPUTS_ATTR on each engine op reading variable values (the indices of those inputs)."""
    for node in graph_def.node:
        if node.op != ENGINE_OP:
            continue
        weights = [i for i, ref in enumerate(node.input) if not ref.startswith("^") and split_ref(ref)[0] in reads]
        if weights:
            node.attr[WEIGHT_INPUTS_ATTR].list.i.extend(weights)


def weight_inputs(node_def) -> List[int]:
    """The indices of an engine op's inputs that are weights (WEIGHT_INPUTS_ATTR; none when absent)."""
    return list(node_def.attr[WEIGHT_INPUTS_ATTR].list.i) if WEIGHT_INPUTS_ATTR in node_def.attr else []


def bind_weights(segment, node_def, values: Sequence[np.ndarray]) -> None:
    """Give `segment` (a build.SegmentGraph) the values of its weight inputs, copied from `values` (one per
    engine op input, as the op runs them) unless it has them already: engines built from it take them as
    weights."""
    missing = [i for i in weight_inputs(node_def) if i not in segment.weights]
    segment.weights.update({i: np.array(values[i], copy=True) for i in missing})
