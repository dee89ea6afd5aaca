"""Load a SavedModel restoring only the variables one signature reads.

TensorFlow's loader restores every object its checkpoint holds, one saveable at a time. A Keras export holds each
variable twice (its ``variables`` and ``_all_variables`` lists name the same weights), so for keras-hub BERT-base the
loader reads 0.88 GB to serve a signature that reads 0.44 GB. Here the loader skips the checkpoint; the variables the
signature captures are found in the checkpoint's object graph (the same walk from the root by child names that
TensorFlow's restore makes) and read with a few ``RestoreV2`` ops side by side, then assigned: BERT-base loads in 1.7 s
instead of 3.2 s on a 2-core CPU. Whatever this cannot map (a captured resource that is not a variable, such as a hash
table whose contents live in the checkpoint; a variable the object graph does not name with one value) is restored by
TensorFlow's own restore of the whole checkpoint instead; a checkpoint without an object graph (a TF1 SavedModel's) by
TensorFlow's loader.

The loader is also given only the functions the object graph's concrete functions call: a TF2 export's function
library also holds its TF1-style saver's functions (``__inference__traced_save`` and ``_traced_restore``: 2,411 of
BERT-base's 4,199 function nodes), which TensorFlow's loader would rebuild as Python graphs for nothing (the load
without its checkpoint: 1.2 -> 0.6 s on a 2-core CPU).
"""
from __future__ import annotations

import concurrent.futures
import logging
import sys
from typing import Dict, Iterator, List, Optional

import tensorflow as tf
from tensorflow.core.protobuf import trackable_object_graph_pb2
from tensorflow.python.checkpoint import checkpoint, checkpoint_options, graph_view
from tensorflow.python.framework import ops
from tensorflow.python.saved_model import load as tf_load
from tensorflow.python.saved_model import loader_impl, path_helpers

__all__ = ["load_for_signature", "captured_resources"]

logger = logging.getLogger(__name__)

#: The checkpoint entry holding its object graph (a TrackableObjectGraph proto).
OBJECT_GRAPH_KEY = "_CHECKPOINTABLE_OBJECT_GRAPH"
#: The attribute of a variable's node naming its value's checkpoint key.
VARIABLE_VALUE = "VARIABLE_VALUE"
#: RestoreV2 ops reading a signature's variables side by side (keras-hub BERT-base's 0.44 GB on a 2-core CPU: 0.36 s
#: in one op, 0.23 s in 2 or 4).
RESTORE_THREADS = 4


def load_for_signature(saved_model_dir: str, tags: List[str], signature_key: str):
    """The loaded SavedModel (as ``tf.saved_model.load``) with the variables its `signature_key` signature reads
    restored; others it holds may stay uninitialized. A missing signature restores nothing (the caller says it is
    missing)."""
    prefix = path_helpers.get_variables_path(saved_model_dir)
    graph = _object_graph(prefix)
    if graph is None:  # a TF1 SavedModel's name-based checkpoint, or no checkpoint: TensorFlow's loader does it all
        return tf.saved_model.load(saved_model_dir, tags=tags)
    loaded = _load_skipping_checkpoint(saved_model_dir, tags)
    func = getattr(loaded, "signatures", {}).get(signature_key)
    if func is None:
        return loaded
    pending = [v for v in func.variables if not bool(v.is_initialized())]
    if not pending:
        return loaded
    keys = _checkpoint_keys(graph, loaded, pending) if _only_variables_captured(func) else None
    if keys is None:
        logger.debug("restoring the whole checkpoint of %s", saved_model_dir)
        saver = checkpoint.TrackableSaver(graph_view.ObjectGraphView(loaded))
        saver.restore(prefix).assert_existing_objects_matched()
        return loaded
    for variable, value in _read(prefix, pending, keys):
        variable.assign(value)
    logger.debug("restored the %d variable(s) signature %r reads", len(pending), signature_key)
    return loaded


def _read(prefix: str, variables, keys: Dict[int, str]) -> Iterator[tuple]:
    """(variable, its value in the checkpoint at `prefix`) for each of `variables` (`keys`: id(variable) -> its
    checkpoint key), read by up to RESTORE_THREADS RestoreV2 ops of about equal bytes side by side: one op reads
    its tensors one after another, and the reading (copies and checksums) runs without the GIL."""
    groups = [[] for _ in range(min(RESTORE_THREADS, len(variables)))]
    loads = [0] * len(groups)
    for variable in sorted(variables, key=_nbytes, reverse=True):
        least = loads.index(min(loads))
        groups[least].append(variable)
        loads[least] += _nbytes(variable)

    def read(group):
        with tf.device("CPU"):
            return tf.raw_ops.RestoreV2(prefix=prefix, tensor_names=[keys[id(v)] for v in group],
                                        shape_and_slices=[""] * len(group), dtypes=[v.dtype for v in group])

    with concurrent.futures.ThreadPoolExecutor(len(groups), thread_name_prefix="tftrt-restore") as pool:
        for group, values in zip(groups, pool.map(read, groups)):
            yield from zip(group, values)


def _nbytes(variable) -> int:
    return int(variable.shape.num_elements() or 0) * variable.dtype.size


def captured_resources(root, func) -> Dict[str, object]:
    """{placeholder name: the trackable owning it} for each resource `func` captures that is not one of its variables
    (a lookup table), found among the objects `root` (the loaded SavedModel) tracks: a converted model saved again
    must track them for TensorFlow to save their creation and initialization (a table's vocabulary asset)."""
    handles = {id(v.handle) for v in func.variables}
    wanted = {id(external): internal.op.name for external, internal in func.graph.captures
              if external.dtype == tf.resource and id(external) not in handles}
    found, seen, todo = {}, {id(root)}, [root]
    while todo and len(found) < len(wanted):
        obj = todo.pop()
        handle = getattr(obj, "resource_handle", None) if not isinstance(obj, tf.Variable) else None
        if handle is not None and id(handle) in wanted:
            found[wanted[id(handle)]] = obj
        children = obj._trackable_children() if hasattr(obj, "_trackable_children") else {}  # pylint: disable=W0212
        for child in children.values():
            if id(child) not in seen:
                seen.add(id(child))
                todo.append(child)
    return found


def _load_skipping_checkpoint(saved_model_dir: str, tags: List[str]):
    """``tf.saved_model.load`` without the checkpoint, its saved_model.pb pruned to the functions the object graph
    needs (see :func:`_prune`). Anything but one object-graph MetaGraph of the tags asked for (or a big-endian host,
    whose loader byte-swaps the functions' constants first) goes through ``tf.saved_model.load`` as it is, as does a
    SavedModel the pruned load fails on (so its error is TensorFlow's own)."""
    options = tf.saved_model.LoadOptions(experimental_skip_checkpoint=True)
    proto = loader_impl.parse_saved_model(saved_model_dir)
    metas = proto.meta_graphs
    if (len(metas) != 1 or not metas[0].HasField("object_graph_def") or sys.byteorder == "big"
            or (tags and set(tags) != set(metas[0].meta_info_def.tags))):
        return tf.saved_model.load(saved_model_dir, tags=tags, options=options)
    _prune(metas[0])
    try:
        with ops.init_scope():  # (as tf.saved_model.load builds its loader)
            return tf_load.Loader(metas[0].object_graph_def, proto, saved_model_dir,
                                  checkpoint_options.CheckpointOptions(), options, None).get(0)
    except Exception as exc:  # pylint: disable=broad-except
        logger.debug("pruned load of %s failed (%s): loading it whole", saved_model_dir, exc)
        return tf.saved_model.load(saved_model_dir, tags=tags, options=options)


def _prune(meta) -> None:
    """Keep in MetaGraphDef `meta` the library functions its object graph's concrete functions call, directly or
    not (through a function-valued attribute, a node whose op is a function, a registered gradient), and of its
    graph's nodes only those the object graph's captured constants are read from (the loader reads nothing else
    of the graph in a TF2 SavedModel)."""
    library = meta.graph_def.library
    functions = {f.signature.name: f for f in library.function}
    gradients = {g.function_name: g.gradient_func for g in library.gradient}
    needed, todo = set(), list(meta.object_graph_def.concrete_functions)
    while todo:
        name = todo.pop()
        if name in needed or name not in functions:
            continue
        needed.add(name)
        if name in gradients:
            todo.append(gradients[name])
        for node in functions[name].node_def:
            todo.append(node.op)
            for attr in node.attr.values():
                todo.extend(_function_names(attr))
    kept = [f for f in library.function if f.signature.name in needed]
    kept_gradients = [g for g in library.gradient if g.function_name in needed]
    constants = {n.constant.operation for n in meta.object_graph_def.nodes if n.WhichOneof("kind") == "constant"}
    nodes = [n for n in meta.graph_def.node if n.name in constants]
    del library.function[:], library.gradient[:], meta.graph_def.node[:]
    library.function.extend(kept)
    library.gradient.extend(kept_gradients)
    meta.graph_def.node.extend(nodes)


def _function_names(attr) -> Iterator[str]:
    """The names of the functions attribute value `attr` refers to (a function, a list of them, and the function
    values among their own attributes)."""
    for func in ([attr.func] if attr.HasField("func") else []) + list(attr.list.func):
        yield func.name
        for inner in func.attr.values():
            yield from _function_names(inner)


def _object_graph(prefix: str):
    """The TrackableObjectGraph of the checkpoint at `prefix`; None when there is none to read or it has no object
    graph (TF1's checkpoints name variables, they hold no object graph)."""
    try:
        reader = tf.train.load_checkpoint(prefix)
        if not reader.has_tensor(OBJECT_GRAPH_KEY):
            return None
        return trackable_object_graph_pb2.TrackableObjectGraph.FromString(reader.get_tensor(OBJECT_GRAPH_KEY))
    except (tf.errors.OpError, ValueError) as exc:
        logger.debug("checkpoint %s unreadable here (%s): TensorFlow's loader reads it", prefix, exc)
        return None


def _only_variables_captured(func) -> bool:
    """Whether every resource `func` captures is one of its variables (a captured table or other resource may
    keep state in the checkpoint that only TensorFlow's restore knows how to read)."""
    handles = {id(v.handle) for v in func.variables}
    return all(id(t) in handles for t in func.captured_inputs if t.dtype == tf.resource)


def _checkpoint_keys(graph, root, variables) -> Optional[Dict[int, str]]:
    """id(variable) -> the checkpoint key of its value in object graph `graph`, for each of `variables`; None when
    one of them has not exactly one value there."""
    wanted = {id(v) for v in variables}
    keys, objects, todo = {}, {0: root}, [0]
    while todo and len(keys) < len(wanted):
        node = todo.pop()
        obj = objects[node]
        if id(obj) in wanted:
            values = [a.checkpoint_key for a in graph.nodes[node].attributes if a.name == VARIABLE_VALUE]
            if len(values) != 1 or len(graph.nodes[node].attributes) != 1:
                return None
            keys[id(obj)] = values[0]
        # (the children TensorFlow's own checkpoint walk uses)
        children = obj._trackable_children() if hasattr(obj, "_trackable_children") else {}  # pylint: disable=W0212
        for ref in graph.nodes[node].children:
            child = children.get(ref.local_name)
            if ref.node_id not in objects and child is not None and 0 <= ref.node_id < len(graph.nodes):
                objects[ref.node_id] = child
                todo.append(ref.node_id)
    return keys if len(keys) == len(wanted) else None
