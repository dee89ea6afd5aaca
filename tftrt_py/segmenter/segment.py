"""A segment: its member nodes, the edges crossing its border, and its segment GraphDef."""
from __future__ import annotations

import dataclasses
from typing import AbstractSet, Dict, List

import tensorflow as tf
from tensorflow.core.framework import graph_pb2

from tftrt_py.convert.build import INPUT_PREFIX, OUTPUT_PREFIX
from tftrt_py.convert.graph import GraphView, split_ref, tensor_ref
from tftrt_py.convert.ops.identity import PASS_THROUGH

__all__ = ["Segment", "build_segment"]


@dataclasses.dataclass
class Segment:
    """Node names and tensor refs ("node:port") of one segment; see :func:`build_segment`."""

    name_index: int
    nodes: List[str]
    inputs: List[str]
    outputs: List[str]
    const_nodes: List[str]
    control_inputs: List[str]
    control_outputs: List[str]
    size: int

    def graph_def(self, view: GraphView) -> graph_pb2.GraphDef:
        """Placeholders for the inputs, the copied Consts and members, Identities for the outputs."""
        out = graph_pb2.GraphDef()
        out.versions.CopyFrom(view.graph_def.versions)
        remap = {}
        for i, ref in enumerate(self.inputs):
            remap[ref] = _placeholder(out, f"{INPUT_PREFIX}{i}", view.dtype(ref), view.shape(ref)).name
        for name in self.const_nodes + self.nodes:
            node = out.node.add()
            node.CopyFrom(view.nodes[name].def_)
            del node.input[:]
            node.input.extend(remap.get(ref, ref) for ref in view.nodes[name].inputs)
        for i, ref in enumerate(self.outputs):
            node = out.node.add(name=f"{OUTPUT_PREFIX}{i}", op="Identity", input=[ref])
            node.attr["T"].type = tf.as_dtype(view.dtype(ref)).as_datatype_enum
        return out


def _placeholder(out, name, dtype, shape):
    node = out.node.add(name=name, op="Placeholder")
    node.attr["dtype"].type = tf.as_dtype(dtype).as_datatype_enum
    node.attr["shape"].shape.CopyFrom(tf.TensorShape(shape).as_proto())
    return node


def build_segment(view: GraphView, name_index: int, members: List[str], fetches: AbstractSet[str]) -> Segment:
    """The segment of `members` (topological order); `fetches` are tensor refs read by the caller."""
    inside = set(members)
    inputs: Dict[str, None] = {}
    consts: Dict[str, None] = {}
    for name in members:
        for ref in view.nodes[name].inputs:
            producer = split_ref(ref)[0]
            if producer in inside:
                continue
            if view.nodes[producer].op == "Const":
                consts[producer] = None
            else:
                inputs[ref] = None
    return Segment(
        name_index=name_index,
        nodes=list(members),
        inputs=list(inputs),
        outputs=_outputs(view, members, inside, fetches),
        const_nodes=list(consts),
        control_inputs=_control_inputs(view, members + list(consts), inside),
        control_outputs=_control_outputs(view, members, inside),
        size=sum(view.nodes[name].op not in PASS_THROUGH for name in members),
    )


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
    """Outside nodes that `names` (members and copied Consts) wait for through control edges."""
    found = dict.fromkeys(dep for name in names for dep in view.nodes[name].control_inputs)
    return [dep for dep in found if dep not in inside]


def _control_outputs(view, members, inside) -> List[str]:
    """Outside nodes that wait for a member through a control edge."""
    found = dict.fromkeys(user for name in members for user in view.consumers[name]
                          if user not in inside and name in view.nodes[user].control_inputs)
    return list(found)
