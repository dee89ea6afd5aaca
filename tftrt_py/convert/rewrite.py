"""Replace each segment by a TRTEngineOp node; keep the segment as <name>_native_segment."""
from __future__ import annotations

import dataclasses
import itertools
import uuid
from typing import Dict, List, Sequence, Tuple

import tensorflow as tf
from tensorflow.core.framework import graph_pb2, node_def_pb2, tensor_shape_pb2
from tensorflow.python.framework import graph_to_function_def

from tftrt_py.convert.build import INPUT_PREFIX, OUTPUT_PREFIX
from tftrt_py.convert.graph import GraphView, restore_weights, split_ref, tensor_ref, without_weights

__all__ = ["ENGINE_OP", "ALLOW_BUILD_ATTR", "MAX_BATCH_SIZE_ANNOTATION", "EngineOpAttrs", "engine_name",
           "native_segment_name", "rewrite", "replace", "native_segment_function", "segment_max_batch_size"]

ENGINE_OP = "TRTEngineOp"
#: TF-TRT's internal (unregistered) attr: whether the op may build an engine at run time (absent: True).
ALLOW_BUILD_ATTR = "_allow_build_at_runtime"
#: TF-TRT's node annotation (TF1): an int capping the max_batch_size of the engine its segment becomes.
MAX_BATCH_SIZE_ANNOTATION = "_tftrt_op_max_batch_size"

#: Graph indices count conversions in this process, so engine and native segment function
#: names never collide in the eager context (the first conversion gets TRTEngineOp_000_*).
_GRAPH_COUNTER = itertools.count()


def engine_name(graph_index: int, index: int) -> str:
    return f"{ENGINE_OP}_{graph_index:03d}_{index:03d}"


def native_segment_name(engine: str) -> str:
    return f"{engine}_native_segment"


@dataclasses.dataclass
class EngineOpAttrs:
    """The conversion-wide attributes every engine op gets."""

    precision_mode: str = "FP32"
    max_cached_engines_count: int = 1
    workspace_size_bytes: int = 1 << 30
    use_calibration: bool = True
    allow_build_at_runtime: bool = True
    static_engine: bool = False
    max_batch_size: int = 1
    use_function_backup: bool = True
    #: TF-TRT's profile_strategy attr: the dynamic-shape strategy, else "ImplicitBatchModeCompatible"
    #: (what engines built per input shape and serving smaller batches amount to).
    profile_strategy: str = "ImplicitBatchModeCompatible"


def segment_max_batch_size(segment, view: GraphView, default: int) -> int:
    """The smallest MAX_BATCH_SIZE_ANNOTATION of the segment's nodes, else `default` (TF-TRT's rule)."""
    caps = [view.nodes[n].def_.attr[MAX_BATCH_SIZE_ANNOTATION].i for n in segment.nodes
            if MAX_BATCH_SIZE_ANNOTATION in view.nodes[n].def_.attr]
    return min(caps, default=default)


def native_segment_function(segment_graph_def, name: str):
    """FunctionDef `name` whose args are the TensorRTInputPH_i and results the TensorRTOutputPH_i."""
    light, weights = without_weights(segment_graph_def)
    graph = tf.Graph()
    with graph.as_default():
        tf.graph_util.import_graph_def(light, name="")
    ops = graph.get_operations()
    by_index = lambda prefix: sorted((op for op in ops if op.name.startswith(prefix)),
                                     key=lambda op: int(op.name.rsplit("_", 1)[1]))
    inputs = [op.outputs[0] for op in by_index(INPUT_PREFIX)]
    outputs = [op.outputs[0] for op in by_index(OUTPUT_PREFIX)]
    body = [op for op in ops if op.type != "Placeholder" or not op.name.startswith(INPUT_PREFIX)]
    fdef = graph_to_function_def.graph_to_function_def(graph, body, inputs, outputs,
                                                       out_names=[t.op.name for t in outputs])
    fdef.signature.name = name
    restore_weights(fdef.node_def, weights)
    return fdef


def _shape_proto(shape) -> tensor_shape_pb2.TensorShapeProto:
    return tf.TensorShape(None if shape is None else list(shape)).as_proto()


def _engine_node(name: str, segment, view: GraphView, attrs: EngineOpAttrs, func_name: str):
    node = node_def_pb2.NodeDef(name=name, op=ENGINE_OP)
    node.input.extend(segment.inputs)
    node.input.extend(f"^{c}" for c in segment.control_inputs)
    a = node.attr
    for key, refs in (("InT", segment.inputs), ("OutT", segment.outputs), ("Tassets", ())):
        a[key].list.SetInParent()
        a[key].list.type.extend(tf.as_dtype(view.dtype(r)).as_datatype_enum for r in refs)
    for key, refs in (("input_shapes", segment.inputs), ("output_shapes", segment.outputs)):
        a[key].list.SetInParent()
        a[key].list.shape.extend(_shape_proto(view.shape(r)) for r in refs)
    if attrs.use_function_backup:
        a["segment_func"].func.name = func_name
    else:
        a["segment_func"].func.SetInParent()
    a["serialized_segment"].s = b""
    a["calibration_data"].s = b""
    a["precision_mode"].s = attrs.precision_mode.encode()
    a["max_cached_engines_count"].i = attrs.max_cached_engines_count
    a["workspace_size_bytes"].i = attrs.workspace_size_bytes
    a["max_batch_size"].i = segment_max_batch_size(segment, view, attrs.max_batch_size)
    a["use_calibration"].b = attrs.use_calibration
    a["static_engine"].b = attrs.static_engine
    a["profile_strategy"].s = attrs.profile_strategy.encode()
    a[ALLOW_BUILD_ATTR].b = attrs.allow_build_at_runtime
    a["segment_key"].s = uuid.uuid4().hex.encode()
    return node


def rewrite(graph_def, view: GraphView, segments: Sequence, attrs: EngineOpAttrs, fetches: Sequence[str] = (),
            graph_index: int = None) -> Tuple[graph_pb2.GraphDef, Dict[str, str]]:
    """The GraphDef with every segment replaced by an engine op (its native segment a function of the library),
    and the renamed fetches (see :func:`replace`)."""
    graph_index = next(_GRAPH_COUNTER) if graph_index is None else graph_index
    replacements = []
    for i, seg in enumerate(segments):
        name = engine_name(graph_index, i)
        fname = native_segment_name(name)
        replacements.append((seg, _engine_node(name, seg, view, attrs, fname),
                             [native_segment_function(seg.graph_def(view), fname)]))
    return replace(graph_def, replacements, fetches)


def replace(graph_def, replacements: Sequence[Tuple[object, node_def_pb2.NodeDef, Sequence[object]]],
            fetches: Sequence[str] = ()) -> Tuple[graph_pb2.GraphDef, Dict[str, str]]:
    """The GraphDef with each (segment, node, functions) replacement made, and the renamed fetches.

    The node takes the segment's place: consumers of a segment output read the node's output of that index
    instead; control edges into and out of members move to the node; the copied nodes (Consts, shape
    computations) that only segments read go. The functions (FunctionDefs) join the library.
    """
    refmap: Dict[str, str] = {}
    owner: Dict[str, str] = {}
    engines: List = []
    out = graph_pb2.GraphDef()
    out.versions.CopyFrom(graph_def.versions)
    out.library.CopyFrom(graph_def.library)
    segments = [seg for seg, _, _ in replacements]
    for seg, node, functions in replacements:
        out.library.function.extend(functions)
        engines.append(node)
        refmap.update({ref: tensor_ref(node.name, k) for k, ref in enumerate(seg.outputs)})
        owner.update({member: node.name for member in seg.nodes})

    def remap(ref: str) -> str:
        if ref.startswith("^"):
            return "^" + owner.get(ref[1:], ref[1:])
        return refmap.get(tensor_ref(*split_ref(ref)), ref)

    def mapped_inputs(node) -> List[str]:
        seen, result = set(), []
        for r in map(remap, node.input):
            if r.startswith("^") and (r in seen or r[1:] == node.name):
                continue
            seen.add(r)
            result.append(r)
        return result

    nodes = [node for node in graph_def.node if node.name not in owner] + engines
    inputs = {node.name: mapped_inputs(node) for node in nodes}
    dropped = _unused_copies(inputs, {c for seg in segments for c in seg.copied_nodes}, fetches)
    for node in nodes:  # each node copied once (a GraphDef's memory only grows: nothing is added to be removed)
        if node.name in dropped:
            continue
        new = out.node.add()
        new.CopyFrom(node)
        del new.input[:]
        new.input.extend(inputs[node.name])
    return out, {f: remap(f) for f in fetches}


def _unused_copies(inputs: Dict[str, List[str]], copies, fetches) -> set:
    """The nodes of `copies` (Consts, shape computations) that nothing reads any more, given each node's inputs."""
    dropped: set = set()
    while True:
        used = {split_ref(r.lstrip("^"))[0] for name, refs in inputs.items() if name not in dropped for r in refs}
        used |= {split_ref(f)[0] for f in fetches}
        more = {name for name in inputs if name in copies and name not in used and name not in dropped}
        if not more:
            return dropped
        dropped |= more
