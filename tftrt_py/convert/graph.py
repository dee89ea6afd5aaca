"""A read-only view over a TF GraphDef: nodes with decoded attributes, edges, dtypes and shapes.

Tensor references are "node:port" strings; control inputs are kept apart. Output dtypes
and static shapes come from importing the GraphDef into a ``tf.Graph`` once.
"""
from __future__ import annotations

import functools
import heapq
from typing import Dict, List, Optional, Tuple

import numpy as np
import tensorflow as tf
from tensorflow.core.framework import attr_value_pb2, function_pb2, graph_pb2

__all__ = ["NodeView", "GraphView", "tensor_ref", "split_ref", "decode_attr", "LARGE_CONST_BYTES", "const_nbytes",
           "without_weights", "function_without_weights", "restore_weights"]

Shape = Optional[Tuple[Optional[int], ...]]

#: A lowered tf.while_loop closes through NextIteration -> Merge (Ref* in TF1 graphs with ref variables).
MERGE_OPS = ("Merge", "RefMerge")
NEXT_ITERATION_OPS = ("NextIteration", "RefNextIteration")


def split_ref(ref: str) -> Tuple[str, int]:
    """'node:1' -> ('node', 1); 'node' -> ('node', 0)."""
    name, _, port = ref.partition(":")
    return name, int(port) if port else 0


def tensor_ref(name: str, port: int = 0) -> str:
    return f"{name}:{port}"


#: Consts of at least this many bytes (weights) stand in as Placeholders where TF only needs the graph's structure.
LARGE_CONST_BYTES = 1 << 16


def const_nbytes(node) -> int:
    """Bytes of Const `node`'s values: its elements times its dtype's size, read from the tensor's shape (a
    TensorProto's ByteSize() serializes it to count, a pass over every byte); strings by that serialized size."""
    tensor = node.attr["value"].tensor
    try:
        nbytes = tf.as_dtype(tensor.dtype).size
    except TypeError:  # not a dtype
        nbytes = 0
    if not nbytes:
        return tensor.ByteSize()
    for dim in tensor.tensor_shape.dim:
        nbytes *= max(dim.size, 0)
    return nbytes


def without_weights(graph_def) -> Tuple[graph_pb2.GraphDef, Dict[str, object]]:
    """(`graph_def` with each Const of LARGE_CONST_BYTES or more replaced by a Placeholder of its dtype and shape,
    those Consts by name).

    TF copies a graph on each import, serialization and grappler pass; a model's weights would be copied as often.
    Its shape inference and rewrites see the same dtypes and shapes through the stand-ins (no shape argument is
    that large), and :func:`restore_weights` puts the Consts back afterwards.
    """
    light = graph_pb2.GraphDef()
    light.versions.CopyFrom(graph_def.versions)
    light.library.CopyFrom(graph_def.library)
    return light, _copy_standing_in(graph_def.node, light.node)


def function_without_weights(fdef) -> Tuple[function_pb2.FunctionDef, Dict[str, object]]:
    """(FunctionDef `fdef` with its weights stood in for, those Consts by name), as :func:`without_weights` does for
    a GraphDef."""
    light = function_pb2.FunctionDef()
    for field in ("signature", "attr", "arg_attr", "resource_arg_unique_id", "ret", "control_ret"):
        getattr(light, field).MergeFrom(getattr(fdef, field))
    return light, _copy_standing_in(fdef.node_def, light.node_def)


def _copy_standing_in(nodes, out) -> Dict[str, object]:
    """Copy `nodes` into the repeated field `out`, the large Consts as stand-ins; those Consts by name."""
    weights = {}
    for node in nodes:
        if node.op == "Const" and const_nbytes(node) >= LARGE_CONST_BYTES:
            weights[node.name] = node
            stand_in = out.add(name=node.name, op="Placeholder", input=node.input, device=node.device)
            stand_in.attr["dtype"].type = node.attr["dtype"].type
            stand_in.attr["shape"].shape.CopyFrom(node.attr["value"].tensor.tensor_shape)
        else:
            out.add().CopyFrom(node)
    return weights


def restore_weights(nodes, weights: Dict[str, object]) -> None:
    """Turn the stand-ins among `nodes` (NodeDefs of a GraphDef or FunctionDef) back into the Consts of
    :func:`without_weights`, keeping each node's inputs and device as they are now."""
    for node in nodes:
        weight = weights.get(node.name) if node.op == "Placeholder" else None
        if weight is not None:
            node.op = "Const"
            node.attr.clear()
            node.attr["dtype"].CopyFrom(weight.attr["dtype"])
            node.attr["value"].CopyFrom(weight.attr["value"])


def decode_attr(value: attr_value_pb2.AttrValue):
    """AttrValue -> a plain Python value (lists, ints, floats, bytes, dtypes as names, shapes as tuples)."""
    kind = value.WhichOneof("value")
    if kind == "list":
        lst = value.list
        for field in ("s", "i", "f", "b", "type", "shape", "tensor", "func"):
            items = getattr(lst, field)
            if items:
                return [decode_attr(_wrap(field, v)) for v in items]
        return []
    if kind == "type":
        return tf.dtypes.as_dtype(value.type).name
    if kind == "shape":
        return _shape(value.shape)
    if kind == "tensor":
        return tf.make_ndarray(value.tensor)
    if kind == "func":
        return value.func.name
    if kind is None:
        return None
    return getattr(value, kind)


def _wrap(field, v):
    a = attr_value_pb2.AttrValue()
    if field in ("shape", "tensor", "func"):
        getattr(a, field).CopyFrom(v)
    else:
        setattr(a, field, v)
    return a


def _shape(proto) -> Shape:
    if proto.unknown_rank:
        return None
    return tuple(d.size if d.size >= 0 else None for d in proto.dim)


class NodeView:
    """One node: name, op, data inputs ("node:port"), control inputs and decoded attrs."""

    def __init__(self, node_def):
        self.def_ = node_def
        self.name: str = node_def.name
        self.op: str = node_def.op
        self.device: str = node_def.device
        refs = list(node_def.input)
        self.inputs: List[str] = [tensor_ref(*split_ref(r)) for r in refs if not r.startswith("^")]
        self.control_inputs: List[str] = [r[1:] for r in refs if r.startswith("^")]

    @functools.cached_property
    def _decoded(self) -> Dict[str, object]:
        return {}

    @property
    def attrs(self) -> Dict[str, object]:
        return {k: self.attr(k) for k in self.def_.attr}

    def attr(self, key: str, default=None):
        """The attribute `key` decoded (decode_attr), once: a Const's value becomes an array only when it is asked
        for, not when another of its attributes is."""
        decoded = self._decoded
        if key not in decoded:
            if key not in self.def_.attr:
                return default
            decoded[key] = decode_attr(self.def_.attr[key])
        return decoded[key]

    def __repr__(self):
        return f"<{self.op} {self.name!r}>"


class GraphView:
    """Nodes by name, consumers, and each tensor's dtype and static shape."""

    def __init__(self, graph_def: graph_pb2.GraphDef):
        self.graph_def = graph_def
        self.nodes: Dict[str, NodeView] = {}
        for n in graph_def.node:
            self.nodes[n.name] = NodeView(n)

    @functools.cached_property
    def _tensor_info(self) -> Tuple[Dict[str, str], Dict[str, Shape], Dict[str, int]]:
        """(dtypes, shapes, output counts) from TF's shape inference, computed on first use."""
        dtypes, shapes, counts = {}, {}, {}
        graph = tf.Graph()
        with graph.as_default():
            tf.graph_util.import_graph_def(without_weights(self.graph_def)[0], name="")
        for op in graph.get_operations():
            counts[op.name] = len(op.outputs)
            for i, t in enumerate(op.outputs):
                ref = tensor_ref(op.name, i)
                dtypes[ref] = t.dtype.base_dtype.name if t.dtype != tf.resource else "resource"
                shapes[ref] = None if t.shape.rank is None else tuple(t.shape.as_list())
        return dtypes, shapes, counts

    # -- queries ----------------------------------------------------------
    def dtype(self, ref: str) -> str:
        return self._tensor_info[0][tensor_ref(*split_ref(ref))]

    def shape(self, ref: str) -> Shape:
        return self._tensor_info[1].get(tensor_ref(*split_ref(ref)))

    def num_outputs(self, name: str) -> int:
        return self._tensor_info[2].get(name, 0)

    def producer(self, ref: str) -> NodeView:
        return self.nodes[split_ref(ref)[0]]

    def const_value(self, ref: str) -> Optional[np.ndarray]:
        """The value of `ref` when its producer is a Const node, else None."""
        node = self.producer(ref)
        return node.attr("value") if node.op == "Const" else None

    @functools.cached_property
    def consumers(self) -> Dict[str, List[str]]:
        """Node name -> names of nodes reading it (data or control), in graph order."""
        users: Dict[str, List[str]] = {name: [] for name in self.nodes}
        for node in self.nodes.values():
            for ref in node.inputs:
                users[split_ref(ref)[0]].append(node.name)
            for name in node.control_inputs:
                users[name].append(node.name)
        return users

    def dependencies(self, node: NodeView) -> List[str]:
        """Names of the nodes `node` reads (data or control), each once, but the NextIteration feeding
        a Merge: that back edge closes a lowered tf.while_loop and is no dependency."""
        names = dict.fromkeys([split_ref(r)[0] for r in node.inputs] + node.control_inputs)
        if node.op in MERGE_OPS:
            return [n for n in names if n not in self.nodes or self.nodes[n].op not in NEXT_ITERATION_OPS]
        return list(names)

    def topological_order(self) -> List[NodeView]:
        """Nodes in a deterministic topological order (graph order breaks ties); loops' back edges are
        left out."""
        index = {name: i for i, name in enumerate(self.nodes)}
        pending = {name: len(self.dependencies(n)) for name, n in self.nodes.items()}
        users = {name: [] for name in self.nodes}
        for name, node in self.nodes.items():
            for producer in self.dependencies(node):
                users.setdefault(producer, []).append(name)

        ready = [index[name] for name, k in pending.items() if k == 0]
        heapq.heapify(ready)
        names = list(self.nodes)
        order = []
        while ready:
            name = names[heapq.heappop(ready)]
            order.append(self.nodes[name])
            for user in users[name]:
                pending[user] -= 1
                if pending[user] == 0:
                    heapq.heappush(ready, index[user])
        if len(order) != len(self.nodes):
            raise ValueError("graph has a cycle (or an input names a missing node)")
        return order
