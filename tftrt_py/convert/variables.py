"""Variables kept as variables: all of them without graph freezing (TF-TRT's
``TF_TRT_EXPERIMENTAL_FEATURES=disable_graph_freezing``), the large ones when freezing (:func:`large_variables`).

Each read of a kept variable (ReadVariableOp) stays native and its value enters the engine ops that use it as
an input, marked in the engine op's WEIGHT_INPUTS_ATTR. The segmenter sees those reads as constants of the
variables' values (:class:`WeightsView`), so converters needing weights accept them. Engines take the values as
weights, not as bindings (:func:`bind_weights`: the converter's ops take the variables' reads at convert(),
sharing their memory; a loaded op copies the values of the first call that builds an engine from its segment);
every call still passes them, and the op and the kernel's native replays skip them (:func:`engine_inputs`).
As in TF-TRT, engines keep the values they were built with: assigning a variable later changes what the native
ops compute, not the engines.

Freezing keeps large variables so a model's weights are held once, by the variables (the engines' networks
share their memory), rather than in every copy of the graph a conversion makes (frozen GraphDef, segment
functions, the op's FunctionDef). The converted SavedModel saves them through its checkpoint, streamed to disk,
with no 2 GB GraphDef limit, when they hold settings.KEEP_VARIABLES bytes (512 MiB) or more together; below that
it saves their values as the constants of one function feeding the same weight inputs (:func:`reads_as_constants`),
which serves as fast as a frozen graph: each read of a variable costs the served call microseconds.
"""
from __future__ import annotations

import dataclasses
from typing import Dict, List, Mapping, Optional, Sequence

import numpy as np
import tensorflow as tf

from tftrt_py import settings
from tftrt_py.convert.graph import GraphView, split_ref, tensor_ref
from tftrt_py.convert.rewrite import ENGINE_OP

__all__ = ["EXPERIMENTAL_FEATURES_ENV", "DISABLE_GRAPH_FREEZING", "WEIGHT_INPUTS_ATTR", "LARGE_VARIABLE_BYTES",
           "WEIGHTS_FUNCTION", "is_experimental_feature_activated", "captured_variables", "REFERENCE_VARIABLE_OPS",
           "reference_variables", "nbytes", "large_variables", "only_read",
           "written", "WRITE_OPS",
           "variable_values", "variable_reads", "read_directly", "WeightsView", "reads_as_constants",
           "reads_as_inputs", "mark_weight_inputs", "weight_inputs", "engine_inputs", "bind_weights"]

#: TF-TRT's switch: comma-separated names of experimental features to turn on.
EXPERIMENTAL_FEATURES_ENV = settings.EXPERIMENTAL_FEATURES.name
DISABLE_GRAPH_FREEZING = "disable_graph_freezing"
#: Our (unregistered) engine op attr: the indices of the inputs that are variable values, taken as weights.
WEIGHT_INPUTS_ATTR = "_tftrt_weight_inputs"

#: Ops passing a resource handle on unchanged (function inlining turns arguments into Identities).
_HANDLE_PASS_THROUGH = ("Identity",)
#: Freezing keeps variables of this many bytes or more as variables (see large_variables). A SavedModel serving them
#: as variables pays about 5 us a call for each read (keras-hub BERT-base with its 72 large variables: 1.29 against
#: 0.90 ms at batch 1 on an H200 machine), so save() writes them as constants unless they hold
#: settings.KEEP_VARIABLES bytes or more together.
LARGE_VARIABLE_BYTES = 1 << 20
#: The prefix of the library function holding the kept variables' values in a SavedModel that saves them as
#: constants (reads_as_constants).
WEIGHTS_FUNCTION = "tftrt_weights"


def is_experimental_feature_activated(feature_name: str) -> bool:
    """Whether `feature_name` is listed in TF_TRT_EXPERIMENTAL_FEATURES now (TF-TRT's utils function)."""
    return feature_name in settings.EXPERIMENTAL_FEATURES.get()


def captured_variables(func) -> Dict[str, tf.Variable]:
    """Placeholder name in `func`'s graph -> the variable whose handle it captures."""
    by_handle = {id(v.handle): v for v in func.variables}
    return {internal.op.name: by_handle[id(external)] for external, internal in func.graph.captures
            if id(external) in by_handle}


#: Ops of TF1 reference variables: state of the graph that holds them, which no function can capture.
REFERENCE_VARIABLE_OPS = frozenset({"VariableV2", "Variable"})


def reference_variables(graph_def) -> List[str]:
    """Names of the reference variables (VariableV2) in `graph_def`: a TF1 SavedModel's signature keeps them inside
    its graph, where a function saved again would hold new, uninitialized variables of those names."""
    return [n.name for n in graph_def.node if n.op in REFERENCE_VARIABLE_OPS]


def nbytes(v: tf.Variable) -> int:
    """The bytes of variable `v`'s value (0 when its shape is not fully known)."""
    return v.shape.num_elements() * v.dtype.size if v.shape.is_fully_defined() else 0


def large_variables(func, min_bytes: int = LARGE_VARIABLE_BYTES) -> Dict[str, tf.Variable]:
    """Placeholder name in `func`'s graph -> the captured variable, for those of `min_bytes` or more."""
    return {name: v for name, v in captured_variables(func).items() if nbytes(v) >= min_bytes}


def read_directly(graph_def, reads: Mapping[str, object]) -> None:
    """Point each read in `reads` at the captured handle itself, dropping the Identities between (function
    inlining leaves one per call): each node of the served graph costs its executor microseconds per call."""
    nodes = {n.name: n for n in graph_def.node}
    for name in reads:
        source = _handle_source(nodes, nodes[name].input[0])
        if source is not None:
            nodes[name].input[0] = source
    drop_unused_handles(graph_def, placeholders=False)


#: Ops that change a variable's value (a prefix of their name): assignments, scatters, optimizer steps.
WRITE_OPS = ("Assign", "ResourceScatter", "ResourceApply", "ResourceSparseApply", "ResourceStridedSliceAssign")


def written(graph_def, placeholders) -> set:
    """The `placeholders` (resource handles) some use of which, through Identities, changes the variable in
    `graph_def` (with its calls inlined): variables the function updates as it runs (a Keras BatchNormalization
    called in training mode inside a serving function). They stay variables whatever their size: frozen, a
    constant would stand where the write needs the handle, and their reads would never see the updates."""
    users = _users(graph_def)

    def writes(name, depth=0):
        return depth < 64 and any(
            user.op.startswith(WRITE_OPS) or (user.op in _HANDLE_PASS_THROUGH and writes(user.name, depth + 1))
            for user in users.get(name, ()))
    return {name for name in placeholders if writes(name)}


def _users(graph_def) -> Dict[str, list]:
    users: Dict[str, list] = {}
    for node in graph_def.node:
        for ref in node.input:
            if not ref.startswith("^"):
                users.setdefault(split_ref(ref)[0], []).append(node)
    return users


def only_read(graph_def, placeholders) -> set:
    """The `placeholders` (resource handles) every use of which, through Identities, is a ReadVariableOp in
    `graph_def` (with its calls inlined): variables that can stay variables, their reads feeding engines.
    Others (gathered by ResourceGather, passed into control flow) are frozen, but for those :func:`written`."""
    users = _users(graph_def)

    def read_only(name, depth=0):
        return depth < 64 and all(
            user.op == "ReadVariableOp" or (user.op in _HANDLE_PASS_THROUGH and read_only(user.name, depth + 1))
            for user in users.get(name, ()))
    return {name for name in placeholders if read_only(name)}


def variable_values(reads: Mapping[str, tf.Variable]) -> Dict[str, np.ndarray]:
    """Read name -> its variable's value now, sharing the variable's memory (read-only; TensorFlow copies a
    variable's buffer before writing it while a read of it is alive)."""
    return {name: np.asarray(v.value()) for name, v in reads.items()}


def variable_reads(graph_def, captured: Mapping[str, tf.Variable]) -> Dict[str, tf.Variable]:
    """ReadVariableOp node name -> the captured variable it reads (through Identities of the handle)."""
    nodes = {n.name: n for n in graph_def.node}
    reads = {n.name: captured.get(_handle_source(nodes, n.input[0])) for n in graph_def.node
             if n.op == "ReadVariableOp"}
    return {name: v for name, v in reads.items() if v is not None}


def _handle_source(nodes, ref: str) -> Optional[str]:
    """The node a resource handle `ref` comes from, past pass-through Identities (None if not in `nodes`)."""
    node = nodes.get(split_ref(ref)[0])
    while node is not None and node.op in _HANDLE_PASS_THROUGH and node.input:
        node = nodes.get(split_ref(node.input[0])[0])
    return None if node is None else node.name


class WeightsView(GraphView):
    """The graph as the segmenter sees it: each variable read a Const holding the variable's value now, and no
    resource handles left that only those reads used (they are no ops to convert or to report native).

    The Consts' protos carry dtype and shape only (no copy of the weights; no 2 GB GraphDef limit); their
    values come from the variables.
    """

    def __init__(self, graph_def, reads: Mapping[str, tf.Variable]):
        self.values = variable_values(reads)
        view = type(graph_def)()
        view.CopyFrom(graph_def)
        for node in view.node:
            if node.name in self.values:
                value = self.values[node.name]
                _make_const(node, tf.as_dtype(value.dtype).as_datatype_enum, tf.TensorShape(value.shape).as_proto())
        drop_unused_handles(view)
        super().__init__(view)

    def const_value(self, ref: str):
        name, port = split_ref(ref)
        return self.values[name] if name in self.values and port == 0 else super().const_value(ref)


def reads_as_constants(graph_def, reads: Mapping[str, tf.Variable], name: str) -> None:
    """Make the reads of `reads` in `graph_def` the results of one call of a new library function `name` returning
    their variables' values now as constants (one per variable), and drop the handles only those reads used: the
    graph a SavedModel serves without variables (each read costs the served call microseconds, its captured handle
    more; TF inlines the call's constants). The engine ops keep taking them as weight inputs. The constants are in a
    function of their own, beside the native segments, so the main graph TF copies over and again stays small. (The
    save moves a variable one engine op alone reads into that op's segment first: convert.segment_weights.)"""
    if not reads:
        return
    call = graph_def.node.add(name=name, op="PartitionedCall")
    call.attr["f"].func.name = name
    call.attr["Tin"].list.SetInParent()
    call.attr["Tout"].list.SetInParent()
    fdef = graph_def.library.function.add()
    fdef.signature.name = name
    results, outputs = {}, {}  # read -> the call's output; id(variable) -> its index (reads of one variable share)
    for read in sorted(reads):
        if id(reads[read]) not in outputs:
            k = outputs[id(reads[read])] = len(outputs)
            value = tf.make_tensor_proto(np.asarray(reads[read].value()))
            _make_const(fdef.node_def.add(name=f"weight_{k}"), value.dtype, value.tensor_shape).tensor.CopyFrom(value)
            fdef.signature.output_arg.add(name=f"weight_{k}", type=value.dtype)
            fdef.ret[f"weight_{k}"] = f"weight_{k}:output:0"
            call.attr["Tout"].list.type.append(value.dtype)
        results[read] = tensor_ref(name, outputs[id(reads[read])])
    for node in graph_def.node:
        if not any(split_ref(r.lstrip("^"))[0] in results for r in node.input):
            continue
        data = [results.get(split_ref(r)[0], r) for r in node.input if not r.startswith("^")]
        control = [f"^{name}" if r[1:] in results else r for r in node.input if r.startswith("^")]
        del node.input[:]
        node.input.extend(data + list(dict.fromkeys(control)))  # (control edges from two reads: one from the call)
    kept = [node for node in graph_def.node if node.name not in results]
    del graph_def.node[:]
    graph_def.node.extend(kept)
    drop_unused_handles(graph_def)


def _make_const(node, dtype: int, shape):
    """Turn `node` into a Const of `dtype` and `shape` (keeping its control inputs); its value's AttrValue, which
    holds no values yet."""
    node.op = "Const"
    node.input[:] = [r for r in node.input if r.startswith("^")]
    node.attr.clear()
    node.attr["dtype"].type = dtype
    node.attr["value"].tensor.dtype = dtype
    node.attr["value"].tensor.tensor_shape.CopyFrom(shape)
    return node.attr["value"]


def drop_unused_handles(graph_def, placeholders: bool = True) -> None:
    """Remove the pass-through Identities of resource handles of `graph_def` that nothing uses, and such
    Placeholders (`placeholders`)."""
    resource = tf.resource.as_datatype_enum
    while True:
        used = {split_ref(ref.lstrip("^"))[0] for node in graph_def.node for ref in node.input}
        unused = [i for i, node in enumerate(graph_def.node) if node.name not in used and (
            (placeholders and node.op == "Placeholder" and node.attr["dtype"].type == resource) or
            (node.op in _HANDLE_PASS_THROUGH and node.attr["T"].type == resource))]
        if not unused:
            return
        for i in reversed(unused):
            del graph_def.node[i]


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


def engine_inputs(node_def) -> List[int]:
    """The indices of an engine op's data inputs its engines bind (every one but the weight inputs)."""
    weights = set(weight_inputs(node_def))
    return [i for i in range(len(node_def.attr["InT"].list.type)) if i not in weights]


def bind_weights(segment, node_def, values, copy: bool = True) -> None:
    """Give `segment` (a build.SegmentGraph) the values of its weight inputs from `values` (indexable by engine
    op input index) unless it has them already: engines built from it take them as weights.

    `copy=False` keeps the arrays given: only for values nothing writes later (a variable's read, which
    TensorFlow copies on write while it is referenced); the kernel's inputs are TensorFlow's buffers for the
    duration of one call, so the op copies them.
    """
    missing = [i for i in weight_inputs(node_def) if i not in segment.weights]
    segment.weights.update({i: np.array(values[i], copy=True) if copy else values[i] for i in missing})
