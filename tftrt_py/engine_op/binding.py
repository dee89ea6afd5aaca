"""The digest an engine op's engines carry: what the segment computes, its binding dtypes and its precision.

An engine restored from a file serves an op only when the digests agree, so a foreign or forged plan is refused.
The digest must not change under transformations that keep the computation: ``tf.saved_model.load`` renames
functions and may reorder a function's nodes, and ``convert_variables_to_constants_v2`` (the user guide's freeze
step) re-serializes the library with nodes in another order and other names. So the segment is hashed as a
dataflow graph (a Merkle digest): each node's digest is its op, the digests of its attributes (a weight's bytes are
hashed where they lie, never copied into text) and the digests of its inputs, in input order; names, node order,
devices and framework annotations (attributes starting with ``_``) take no part. Nor does how TensorFlow happens to
write an equal node: saving a model drops attributes at their op's default (loading puts them back) and compresses
constants (a run of equal values dropped, ``tensor_content`` turned into a value list), so an attribute at its
default counts as absent and a tensor counts by its dtype, shape and values.
"""
from __future__ import annotations

import collections
import functools
import hashlib
import json
from typing import Dict, Mapping, Optional

from tensorflow.core.framework import function_pb2, types_pb2

from tftrt_py.convert.graph import NodeView
from tftrt_py.engine.plan import MAGIC as PLAN_MAGIC

__all__ = ["segment_binding", "binding_of", "function_digest"]


def segment_binding(node_def, function_def: bytes, callees: bytes = b"") -> str:
    """SHA-256 of what an engine op's engines are built for: its native segment (the function's dataflow, see
    :func:`function_digest`, or else a serialized segment GraphDef), its binding dtypes and precision."""
    library = function_pb2.FunctionDefLibrary.FromString(callees).function if callees else ()
    return binding_of(node_def, function_pb2.FunctionDef.FromString(function_def) if function_def else None,
                      {f.signature.name: f for f in library})


def binding_of(node_def, fdef=None, callees: Mapping[str, object] = {}) -> str:
    """segment_binding of a parsed native segment function `fdef` (None: the node has none) and the functions it
    calls (`callees` by name)."""
    node = NodeView(node_def)
    segment = node.attr("serialized_segment") or b""
    body = b"" if segment.startswith(PLAN_MAGIC) else segment
    if fdef is not None:
        body = function_digest(fdef, callees).encode()
    parts = {"segment": hashlib.sha256(body).hexdigest(), "inputs": [str(t) for t in node.attr("InT") or []],
             "outputs": [str(t) for t in node.attr("OutT") or []],
             "precision": node.attr("precision_mode", b"FP32").decode().upper()}
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


def function_digest(fdef, callees: Mapping[str, object] = {}, _seen: Optional[Dict[str, str]] = None) -> str:
    """The digest of `fdef`'s computation: its arguments' types by position, and per output (in signature order)
    the Merkle digest of the node computing it. Functions it calls (func attributes) count by their own digest
    when `callees` holds them, else by name."""
    seen = {} if _seen is None else _seen
    seen.setdefault(fdef.signature.name, "recursive")  # a function reaching itself (refused elsewhere) ends here
    digests: Dict[str, str] = {a.name: _sha(f"arg{i}:{a.type}:{a.type_attr}")
                               for i, a in enumerate(fdef.signature.input_arg)}
    nodes = {n.name: n for n in fdef.node_def}

    def source(ref: str) -> str:
        return ref.lstrip("^").split(":", 1)[0]

    pending = {name: {source(r) for r in n.input if source(r) in nodes} for name, n in nodes.items()}
    users = collections.defaultdict(list)
    for name, deps in pending.items():
        for dep in deps:
            users[dep].append(name)
    ready = collections.deque(sorted(name for name, deps in pending.items() if not deps))
    while ready:
        name = ready.popleft()
        digests[name] = _node_digest(nodes[name], digests, callees, seen)
        for user in users[name]:
            pending[user].discard(name)
            if not pending[user]:
                ready.append(user)
    for name in sorted(set(nodes) - set(digests)):  # a cycle (TF1 loops): such nodes count by content alone
        digests[name] = _node_digest(nodes[name], {}, callees, seen)

    def ref_digest(ref: str) -> str:
        head, _, port = ref.partition(":")
        return f"{digests.get(head, head)}:{port}"

    outputs = [ref_digest(fdef.ret[a.name]) if a.name in fdef.ret else f"missing:{a.name}"
               for a in fdef.signature.output_arg]
    types = [f"{a.type}:{a.type_attr}" for a in fdef.signature.output_arg]
    inputs = [f"{a.type}:{a.type_attr}" for a in fdef.signature.input_arg]
    return _sha(json.dumps([inputs, outputs, types]))


def _node_digest(node, digests: Mapping[str, str], callees: Mapping[str, object], seen: Dict[str, str]) -> str:
    data, control = [], []
    for ref in node.input:
        if ref.startswith("^"):
            control.append(digests.get(ref[1:], "?"))
            continue
        head, sep, port = ref.partition(":")
        data.append(f"{digests.get(head, '?')}{sep}{port}")
    attrs = {}
    defaults = _defaults(node.op)
    for key in sorted(node.attr):
        value = node.attr[key]
        if key.startswith("_") or (key in defaults and value.SerializeToString(deterministic=True) == defaults[key]):
            continue
        if value.HasField("func"):
            attrs[key] = ["func", _callee(value.func, callees, seen)]
        elif value.HasField("list") and value.list.func:
            attrs[key] = ["funcs", [_callee(f, callees, seen) for f in value.list.func]]
        else:
            attrs[key] = _attr_digest(value)
    op = _callee_digest(node.op, callees, seen) if node.op in callees else node.op
    return _sha(json.dumps([op, data, sorted(control), attrs]))


def _callee(func, callees, seen) -> list:
    """A func attribute by the callee's digest (or name) and its instantiation attributes."""
    attrs = {k: _attr_digest(func.attr[k]) for k in sorted(func.attr)}
    return [_callee_digest(func.name, callees, seen), attrs]


def _callee_digest(name: str, callees, seen) -> str:
    if name not in callees:
        return name
    if name not in seen:
        seen[name] = function_digest(callees[name], callees, seen)
    return seen[name]


def _attr_digest(value) -> str:
    if value.HasField("tensor") and value.tensor.dtype not in OPAQUE_DTYPES:
        return _tensor_digest(value.tensor)
    return hashlib.sha256(value.SerializeToString(deterministic=True)).hexdigest()


#: Tensors of these dtypes count by their serialization (TensorFlow does not compress them).
OPAQUE_DTYPES = frozenset({types_pb2.DT_STRING, types_pb2.DT_RESOURCE, types_pb2.DT_VARIANT})


def _tensor_digest(tensor) -> str:
    """A TensorProto by its dtype, shape and values, whichever way they are written."""
    digest = hashlib.sha256(f"{tensor.dtype}:{[d.size for d in tensor.tensor_shape.dim]}".encode())
    if tensor.tensor_content:
        digest.update(tensor.tensor_content)
    else:
        from tensorflow.python.framework import tensor_util  # pylint: disable=import-outside-toplevel

        digest.update(tensor_util.MakeNdarray(tensor).tobytes())
    return digest.hexdigest()


@functools.lru_cache(maxsize=None)
def _defaults(op: str) -> Dict[str, bytes]:
    """The serialized default of each attribute of `op` that has one (none for an op not registered here)."""
    from tensorflow.python.framework import op_def_registry  # pylint: disable=import-outside-toplevel

    op_def = op_def_registry.get(op)
    if op_def is None:
        return {}
    return {a.name: a.default_value.SerializeToString(deterministic=True) for a in op_def.attr
            if a.HasField("default_value")}


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()
