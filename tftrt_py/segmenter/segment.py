"""A segment: its member nodes, the nodes copied into it, the edges crossing its border, its segment GraphDef."""
from __future__ import annotations

import dataclasses
from typing import AbstractSet, Dict, List, Set

import tensorflow as tf
from tensorflow.core.framework import graph_pb2

from tftrt_py.convert.build import INPUT_PREFIX, OUTPUT_PREFIX
from tftrt_py.convert.context import ValidationContext
from tftrt_py.convert.graph import GraphView, NodeView, split_ref, tensor_ref
from tftrt_py.convert.ops import find_converter
from tftrt_py.convert.ops.base import STATIC

__all__ = ["UNCOUNTED_OPS", "Segment", "build_segment", "copied_nodes"]

#: Ops that do not count towards minimum_segment_size (TF-TRT's segment.cc: IdentityN counts).
UNCOUNTED_OPS = ("Identity", "Snapshot", "StopGradient")


@dataclasses.dataclass
class Segment:
    """Node names and tensor refs ("node:port") of one segment; see :func:`build_segment`."""

    name_index: int
    nodes: List[str]
    inputs: List[str]
    outputs: List[str]
    copied_nodes: List[str]
    control_inputs: List[str]
    control_outputs: List[str]
    size: int

    def graph_def(self, view: GraphView) -> graph_pb2.GraphDef:
        """Placeholders for the inputs, the copied nodes and members, Identities for the outputs."""
        out = graph_pb2.GraphDef()
        out.versions.CopyFrom(view.graph_def.versions)
        remap = {}
        for i, ref in enumerate(self.inputs):
            remap[ref] = _placeholder(out, f"{INPUT_PREFIX}{i}", view.dtype(ref), view.shape(ref)).name
        for name in self.copied_nodes + self.nodes:
            node = out.node.add()
            node.CopyFrom(view.nodes[name].def_)
            del node.input[:]
            node.input.extend(remap.get(ref, ref) for ref in view.nodes[name].inputs)
        for i, ref in enumerate(self.outputs):
            node = out.node.add(name=f"{OUTPUT_PREFIX}{i}", op="Identity", input=[ref])
            node.attr["T"].type = tf.as_dtype(view.dtype(ref)).as_datatype_enum
        return out

    def static_inputs_outside(self, view: GraphView) -> List[str]:
        """Inputs that a converter needs known when building but that the segment cannot compute
        ("node:port" of the reading node): each would reach the engine at run time and fail its build."""
        wanted = [(name, i) for name in self.copied_nodes + self.nodes
                  for i in _static_positions(view.nodes[name])]
        if not wanted:
            return []
        inner = GraphView(self.graph_def(view))
        ctx = ValidationContext(inner)
        return [f"{name}:{i}" for name, i in wanted if not ctx.is_static(inner.nodes[name].inputs[i])]


def _static_positions(node: NodeView) -> List[int]:
    """The inputs of `node` its converter needs known when building."""
    spec = find_converter(node.op).input_spec
    return [i for i in range(len(node.inputs)) if spec[min(i, len(spec) - 1)] == STATIC]


def _placeholder(out, name, dtype, shape):
    node = out.node.add(name=name, op="Placeholder")
    node.attr["dtype"].type = tf.as_dtype(dtype).as_datatype_enum
    node.attr["shape"].shape.CopyFrom(tf.TensorShape(shape).as_proto())
    return node


def copied_nodes(view: GraphView, order: List[NodeView], candidates: AbstractSet[str]) -> Set[str]:
    """Consts, and the candidates known when building (shape computations: Shape -> StridedSlice -> Pack):
    each is copied into every segment that reads it, so a value a converter needs when building never
    arrives at run time."""
    ctx = ValidationContext(view, {node.name for node in order if node.name not in candidates})
    return {node.name for node in order
            if node.op == "Const" or node.name in candidates and ctx.is_static(node.name)}


def build_segment(view: GraphView, name_index: int, cluster: List[str], copied: AbstractSet[str],
                  fetches: AbstractSet[str]) -> Segment:
    """The segment of `cluster` (topological order): its members but the `copied` nodes, which are copied
    in where a member reads them (as are their own copied inputs); `fetches` are tensor refs read by the
    caller. Its size counts the cluster and the copies but Identity, Snapshot and StopGradient."""
    members = [name for name in cluster if name not in copied]
    inside = set(members)
    inputs: Dict[str, None] = {}
    copies: Dict[str, None] = {}

    def read(ref):
        producer = split_ref(ref)[0]
        if producer in inside or producer in copies:
            return
        if producer in copied:
            for inner in view.nodes[producer].inputs:
                read(inner)
            copies[producer] = None  # after its inputs: topological order
        else:
            inputs[ref] = None

    for name in members:
        for ref in view.nodes[name].inputs:
            read(ref)
    copies = list(copies)
    wholly = _wholly_inside(view, inside, copies, fetches)
    return Segment(
        name_index=name_index,
        nodes=members,
        inputs=list(inputs),
        outputs=_outputs(view, members, wholly, fetches),
        copied_nodes=copies,
        control_inputs=_control_inputs(view, members + copies, inside.union(copies)),
        control_outputs=_control_outputs(view, members, wholly),
        size=sum(view.nodes[name].op not in UNCOUNTED_OPS for name in dict.fromkeys(cluster + copies)),
    )


def _wholly_inside(view, members, copies, fetches) -> Set[str]:
    """Members, and the copies read only by members and such copies (not fetched): nothing outside reads
    a member's tensor through them."""
    inside = set(members)
    fetched = {split_ref(ref)[0] for ref in fetches}
    for name in reversed(copies):  # readers first
        if name not in fetched and all(user in inside for user in view.consumers[name]):
            inside.add(name)
    return inside


def _outputs(view, members, inside, fetches) -> List[str]:
    """Member tensors read outside the segment or fetched, by member then port."""
    read = set(fetches)
    for name in members:
        for user in view.consumers[name]:
            if user not in inside:
                read.update(view.nodes[user].inputs)
    refs = (tensor_ref(name, port) for name in members for port in range(view.num_outputs(name)))
    return [ref for ref in refs if ref in read]


def _control_inputs(view, names, inside) -> List[str]:
    """Outside nodes that `names` (members and copies, `inside`) wait for through control edges."""
    found = dict.fromkeys(dep for name in names for dep in view.nodes[name].control_inputs)
    return [dep for dep in found if dep not in inside]


def _control_outputs(view, members, inside) -> List[str]:
    """Outside nodes that wait for a member through a control edge."""
    found = dict.fromkeys(user for name in members for user in view.consumers[name]
                          if user not in inside and name in view.nodes[user].control_inputs)
    return list(found)
