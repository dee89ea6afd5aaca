"""An ONNX graph under construction: unique value names, nodes, initializers and the dtype maps.

Lowerings add nodes through :class:`Graph` only; ``onnx`` is imported when a graph is made, not before.
"""
from __future__ import annotations

import itertools
from typing import Callable, Dict, List, Optional, Sequence, Union

import numpy as np

__all__ = ["Graph", "onnx_dtype", "compute_dtype", "prune", "OPSET", "CONTRIB", "EXTERNAL_BYTES"]

#: The ONNX opset lowered graphs use (BitCast needs 26; ONNX Runtime 1.32 runs it).
OPSET = 26
#: ONNX Runtime's contrib domain (version 1): its fused kernels where they compute the layers' math.
CONTRIB = "com.microsoft"
#: Constants of this many bytes or more stay out of the model proto when the graph is given an `external` dict:
#: the proto names them as external data and the session takes the arrays themselves (reading the layers' own in
#: place, copying the others once: OnnxRuntimeBackend.session), where serializing them into the proto and parsing it
#: back would copy a model's weights several times over.
EXTERNAL_BYTES = 1 << 12


def onnx_dtype(dtype) -> int:
    """The TensorProto element type of a numpy dtype (or dtype name)."""
    from onnx import helper

    return helper.np_dtype_to_tensor_dtype(np.dtype(dtype))


def compute_dtype(dtype: str) -> str:
    """The dtype a layer computes a tensor of `dtype` in on the CPU: float16 widens to float32."""
    return "float32" if dtype == "float16" else dtype


class Graph:
    """Nodes and initializers of one ONNX graph; every value gets a fresh name.

    With `external` (a dict), constants of EXTERNAL_BYTES or more go there by initializer name, not into the
    proto (see EXTERNAL_BYTES).
    """

    def __init__(self, external: Optional[Dict[str, np.ndarray]] = None):
        self.nodes: list = []
        self.initializers: list = []
        self.external = external
        self._ids = itertools.count()
        #: uint8 forms of engine tensors by tensor name (see :mod:`.int8`): value names, or makers of them
        self.uint8: Dict[str, Union[str, Callable[[], str]]] = {}

    def fresh(self, base: str = "v") -> str:
        return f"{base}#{next(self._ids)}"

    def branch(self) -> "Graph":
        """An empty graph for a branch of an ``If`` node of this one: names from this graph's sequence (a branch
        reads this graph's values by name), its constants kept in its own proto."""
        sub = Graph()
        sub._ids = self._ids
        return sub

    def when(self, cond: str, then: Callable[["Graph"], str], otherwise: Callable[["Graph"], str],
             dtype: str) -> str:
        """An ``If`` node on the bool scalar `cond`: the value `then(branch)` builds where it is true, else the
        value `otherwise(branch)` builds; both of `dtype`."""
        from onnx import helper

        branches = {}
        for key, build in (("then_branch", then), ("else_branch", otherwise)):
            sub = self.branch()
            out = build(sub)
            branches[key] = helper.make_graph(sub.nodes, self.fresh(key), [], [
                helper.make_tensor_value_info(out, onnx_dtype(dtype), None)], initializer=sub.initializers)
        return self.node("If", [cond], **branches)

    def node(self, op: str, inputs: Sequence[str], outputs: int = 1, domain: str = "", **attrs
             ) -> Union[str, List[str]]:
        """Add node `op`; returns its output name (a list when `outputs` > 1). Attributes are keywords."""
        from onnx import helper

        names = [self.fresh(op) for _ in range(outputs)]
        self.nodes.append(helper.make_node(op, list(inputs), names, name=self.fresh(op), domain=domain or None,
                                           **{k: v for k, v in attrs.items() if v is not None}))
        return names[0] if outputs == 1 else names

    def const(self, value, dtype=None) -> str:
        """An initializer holding `value` (cast to `dtype` when given)."""
        from onnx import TensorProto, numpy_helper

        array = np.asarray(value, dtype=dtype, order="C")  # (ascontiguousarray makes scalars 1-d); not copied
        name = self.fresh("const")
        if self.external is None or array.nbytes < EXTERNAL_BYTES:
            self.initializers.append(numpy_helper.from_array(array, name))
            return name
        proto = TensorProto(name=name, data_type=onnx_dtype(array.dtype), dims=array.shape,
                            data_location=TensorProto.EXTERNAL)
        for key, value in (("location", "tftrt_py-external"), ("offset", "0"), ("length", str(array.nbytes))):
            proto.external_data.add(key=key, value=value)
        self.initializers.append(proto)
        self.external[name] = array
        return name

    def ints(self, values: Sequence[int]) -> str:
        """A 1-d int64 initializer (shapes, axes, starts...)."""
        return self.const(np.asarray(list(values), np.int64).reshape(-1))

    def scalar(self, value, dtype) -> str:
        return self.const(np.asarray(value, dtype=dtype))

    def cast(self, x: str, have: str, want: str) -> str:
        """`x` (of dtype `have`) as `want`; no node when they are equal."""
        return x if have == want else self.node("Cast", [x], to=onnx_dtype(want))

    def transpose(self, x: str, perm: Sequence[int]) -> str:
        perm = [int(p) for p in perm]
        return x if perm == sorted(perm) else self.node("Transpose", [x], perm=perm)

    def reshape(self, x: str, shape: Sequence[int]) -> str:
        return self.node("Reshape", [x, self.ints(shape)], allowzero=1)

    def model(self, name: str, inputs: Sequence, outputs: Sequence):
        """The ``onnx.ModelProto`` of these nodes and initializers, between `inputs` and `outputs` (value infos), in
        the opsets and IR version ONNX Runtime runs."""
        from onnx import helper

        graph = helper.make_graph(self.nodes, name, list(inputs), list(outputs), initializer=self.initializers)
        opsets = [helper.make_opsetid("", OPSET), helper.make_opsetid(CONTRIB, 1)]
        model = helper.make_model(graph, opset_imports=opsets, producer_name="tftrt_py")
        model.ir_version = 10
        return model

    def slice(self, x: str, starts, ends, axes, steps=None) -> str:
        ins = [x, self.ints(starts), self.ints(ends), self.ints(axes)]
        if steps is not None:
            ins.append(self.ints(steps))
        return self.node("Slice", ins)


def prune(model):
    """`model` (changed in place) without the nodes and initializers no graph output depends on: ONNX Runtime
    keeps and runs them (the int8 lowering leaves float forms of tensors that only quantized layers read)."""
    graph = model.graph
    live, kept = {o.name for o in graph.output}, []
    for node in reversed(graph.node):
        if any(name in live for name in node.output):
            kept.append(node)
            live.update(_reads(node))
    if len(kept) < len(graph.node):
        del graph.node[:]
        graph.node.extend(reversed(kept))
        weights = [w for w in graph.initializer if w.name in live]
        del graph.initializer[:]
        graph.initializer.extend(weights)
    return model


def _reads(node) -> List[str]:
    """The names `node` reads: its inputs, and those the nodes of its branches (an ``If``'s) read."""
    from onnx import AttributeProto

    names = list(node.input)
    for attr in node.attribute:
        if attr.type == AttributeProto.GRAPH:
            for inner in attr.g.node:
                names.extend(_reads(inner))
    return names
