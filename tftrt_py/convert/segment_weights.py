"""Weights saved inside the native segment functions of the engine ops that read them.

During a conversion an engine op reads its large weights as variable reads (weight inputs, see
convert.variables): the weights stay once in memory, in the variables. A SavedModel that serves without variables
needs their values somewhere. Where a read feeds only the weight inputs of one engine op, its value goes into that
op's native segment function as a Const and the op loses the input: the saved engines hold the weight already, and
the native segment (and an engine built later, which reads the segment's constants) finds it there, as in a model
TF-TRT converted frozen. So a served call passes nothing for it: each weight input costs TensorFlow about a
microsecond a call (a Const node run, a tensor passed; keras-hub BERT-base has 72).
"""
from __future__ import annotations

import bisect
import collections
import uuid
from typing import Dict, List, Mapping, Set, Tuple

import numpy as np
import tensorflow as tf
from tensorflow.core.framework import tensor_shape_pb2

from tftrt_py.convert.graph import split_ref
from tftrt_py.convert.rewrite import ENGINE_OP
from tftrt_py.convert.variables import WEIGHT_INPUTS_ATTR, drop_unused_handles, weight_inputs

__all__ = ["reads_into_segments", "fresh_function_name", "WEIGHTS_SUFFIX"]

#: Attributes of an engine op with one entry per data input.
_PER_INPUT_LISTS = (("InT", "type"), ("input_shapes", "shape"))


def reads_into_segments(graph_def, reads: Mapping[str, tf.Variable]) -> Tuple[Set[str], Set[str]]:
    """Move each read of `reads` that only one engine op's weight input uses, the only read of its variable, into
    that op's native segment function of `graph_def`'s library, as a Const of the variable's value now; drop the
    read. Only segment functions that call no other function change (their digest, engine_op.binding, is then
    theirs alone: the caller gives the op's saved engines the new one), and a changed one takes a new name
    (:func:`fresh_function_name`), so no definition of another content shares its name. Returns (the reads moved,
    the engine ops changed); the other reads stay as they were, so no value is saved twice."""
    users: Dict[str, List[Tuple[str, int]]] = {}  # data uses only: a constant needs no control edge
    for node in graph_def.node:
        for i, ref in enumerate(node.input):
            name = split_ref(ref)[0]
            if name in reads and not ref.startswith("^"):
                users.setdefault(name, []).append((node.name, i))
    reads_of = collections.Counter(id(v) for v in reads.values())
    single = {name: users.get(name) for name, v in reads.items() if reads_of[id(v)] == 1}  # its variable's only read
    functions = {f.signature.name: f for f in graph_def.library.function}
    moved, changed = set(), set()
    for node in graph_def.node:
        fdef = functions.get(node.attr["segment_func"].func.name) if node.op == ENGINE_OP else None
        if fdef is None or _calls(fdef, functions):
            continue
        movable = [i for i in weight_inputs(node) if _only_user(node, i, single)]
        _args_to_consts(fdef, {i: np.asarray(reads[split_ref(node.input[i])[0]].value()) for i in movable})
        for i in sorted(movable, reverse=True):
            moved.add(split_ref(node.input[i])[0])
            changed.add(node.name)
            _drop_input(node, i)
        if movable:
            fdef.signature.name = fresh_function_name(fdef.signature.name)
            node.attr["segment_func"].func.name = fdef.signature.name
    if moved:
        kept = [n for n in graph_def.node if n.name not in moved]
        del graph_def.node[:]
        graph_def.node.extend(kept)
        for node in graph_def.node:  # control edges from a moved read (the function's closing NoOp's) go with it
            if any(ref.startswith("^") and ref[1:] in moved for ref in node.input):
                node.input[:] = [ref for ref in node.input if not (ref.startswith("^") and ref[1:] in moved)]
        drop_unused_handles(graph_def)
    return moved, changed


#: What names a native segment function holding the weights its engine op read (reads_into_segments) ends with.
WEIGHTS_SUFFIX = "_with_weights_"


def fresh_function_name(name: str) -> str:
    """A name no other function has: `name` (less an earlier suffix of this kind) with WEIGHTS_SUFFIX and a random
    hex suffix."""
    return f"{name.split(WEIGHTS_SUFFIX)[0]}{WEIGHTS_SUFFIX}{uuid.uuid4().hex}"


def _calls(fdef, functions) -> bool:
    """Whether `fdef` calls a function: an op named after one, or a function in an attribute."""
    for node in fdef.node_def:
        if node.op in functions:
            return True
        for value in node.attr.values():
            if value.HasField("func") or (value.HasField("list") and len(value.list.func)):
                return True
    return False


def _only_user(node, i: int, single) -> bool:
    """Whether input `i` of engine op `node` is port 0 of a read of `single` (the only read of its variable) that
    only it uses, once, as data (so its value is saved once; control edges from the read do not count)."""
    name, port = split_ref(node.input[i])
    return port == 0 and single.get(name) == [(node.name, i)]


def _args_to_consts(fdef, values: Mapping[int, np.ndarray]) -> None:
    """Replace the arguments of `fdef` at the indices of `values` by Const nodes holding those values (renumbering the
    argument attributes), in one pass over its nodes (BERT-base's segment function has 72 such arguments)."""
    if not values:
        return
    outputs, taken = {}, {n.name for n in fdef.node_def} | {a.name for a in fdef.signature.input_arg}
    for i, value in values.items():
        arg = fdef.signature.input_arg[i]
        const = _const(fdef, arg, value, _fresh_name(taken, f"{arg.name}_weight"))
        outputs[arg.name] = outputs[f"{arg.name}:0"] = f"{const.name}:output:0"
    for node in fdef.node_def:
        if any(ref in outputs for ref in node.input):
            node.input[:] = [outputs.get(ref, ref) for ref in node.input]
    for key, ref in list(fdef.ret.items()):
        if ref in outputs:
            fdef.ret[key] = outputs[ref]
    removed = sorted(values)
    for i in reversed(removed):
        del fdef.signature.input_arg[i]
    for table in (fdef.arg_attr, fdef.resource_arg_unique_id):  # keyed by argument index: those after shift down
        entries = [(k - bisect.bisect_left(removed, k), _copied(v)) for k, v in table.items() if k not in values]
        table.clear()
        for k, v in entries:
            if hasattr(v, "CopyFrom"):
                table[k].CopyFrom(v)
            else:
                table[k] = v


def _const(fdef, arg, value: np.ndarray, name: str):
    """A new Const node `name` of `fdef` holding `value`, for argument `arg` (of the same dtype)."""
    dtype = tf.as_dtype(value.dtype)
    if dtype.as_datatype_enum != arg.type:
        raise ValueError(f"weight for argument {arg.name} of {fdef.signature.name} is {dtype}, the argument "
                         f"{tf.as_dtype(arg.type)}")
    const = fdef.node_def.add(name=name, op="Const")
    const.attr["dtype"].type = arg.type
    tensor = const.attr["value"].tensor
    if value.dtype.kind in "iuf" and value.size > 1:  # as make_tensor_proto writes it, without its proto's copy
        tensor.dtype = arg.type
        tensor.tensor_shape.dim.extend(tensor_shape_pb2.TensorShapeProto.Dim(size=d) for d in value.shape)
        tensor.tensor_content = np.ascontiguousarray(value).tobytes()
    else:
        tensor.CopyFrom(tf.make_tensor_proto(value))
    return const


def _copied(value):
    if not hasattr(value, "CopyFrom"):
        return value
    out = type(value)()
    out.CopyFrom(value)
    return out


def _fresh_name(taken: Set[str], base: str) -> str:
    """`base`, or `base_<k>` for the least k not in `taken`; added to `taken`."""
    name, k = base, 0
    while name in taken:
        k += 1
        name = f"{base}_{k}"
    taken.add(name)
    return name


def _drop_input(node, i: int) -> None:
    """Remove data input `i` of engine op `node`: its entries in the per-input attributes, and its index from the
    weight inputs (those after it shift down)."""
    del node.input[i]
    for key, field in _PER_INPUT_LISTS:
        if key in node.attr:
            del getattr(node.attr[key].list, field)[i]
    weights = [w - 1 if w > i else w for w in weight_inputs(node) if w != i]
    if weights:
        node.attr[WEIGHT_INPUTS_ATTR].list.i[:] = weights
    else:
        del node.attr[WEIGHT_INPUTS_ATTR]
