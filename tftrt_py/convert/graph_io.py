"""Graph I/O: load a SavedModel signature, freeze it, run grappler, rebuild a function from a GraphDef."""
from __future__ import annotations

import logging
import os
from typing import Sequence

import tensorflow as tf
from tensorflow.core.protobuf import config_pb2, meta_graph_pb2
from tensorflow.python.eager import context, wrap_function
from tensorflow.python.framework import convert_to_constants
from tensorflow.python.grappler import tf_optimizer
from tensorflow.python.training import saver
from tensorflow.python.util import nest

__all__ = ["load_signature", "freeze", "optimize", "function_from_graph_def", "SavedModelError"]

logger = logging.getLogger(__name__)

#: Grappler passes run before segmentation (no layout or remapper: they create ops engines don't know).
GRAPPLER_OPTIMIZERS = ("pruning", "debug_stripper", "constfold", "dependency", "common_subgraph_elimination")


class SavedModelError(ValueError):
    """The input SavedModel is missing, malformed, or lacks the requested tags or signature."""


def load_signature(saved_model_dir: str, tags: Sequence[str], signature_key: str):
    """(loaded object, signature function); clear errors for a missing dir, tags or signature."""
    if not saved_model_dir:
        raise SavedModelError("input_saved_model_dir is required")
    if not os.path.isdir(saved_model_dir):
        raise SavedModelError(f"SavedModel directory {saved_model_dir!r} does not exist")
    if not any(os.path.exists(os.path.join(saved_model_dir, f)) for f in ("saved_model.pb", "saved_model.pbtxt")):
        raise SavedModelError(f"{saved_model_dir!r} holds no saved_model.pb: it is not a SavedModel directory")
    try:
        loaded = tf.saved_model.load(saved_model_dir, tags=list(tags))
    except (tf.errors.OpError, ValueError, RuntimeError, OSError) as exc:
        raise SavedModelError(f"cannot load SavedModel {saved_model_dir!r} with tags {list(tags)}: {exc}") from exc
    signatures = getattr(loaded, "signatures", {})
    if signature_key not in signatures:
        raise SavedModelError(f"SavedModel {saved_model_dir!r} has no signature {signature_key!r}; "
                              f"available: {sorted(signatures)}")
    return loaded, signatures[signature_key]


def freeze(func):
    """The function with its variables turned into constants."""
    return convert_to_constants.convert_variables_to_constants_v2(func)


def optimize(graph_def, graph, fetch_names: Sequence[str]):
    """Run grappler's constant folding and friends, keeping the fetched tensors."""
    for node in graph_def.node:
        node.device = ""
    meta_graph = saver.export_meta_graph(graph_def=graph_def, graph=graph)
    fetches = meta_graph_pb2.CollectionDef()
    fetches.node_list.value.extend(fetch_names)
    meta_graph.collection_def["train_op"].CopyFrom(fetches)
    config = config_pb2.ConfigProto()
    rewrite = config.graph_options.rewrite_options
    rewrite.min_graph_nodes = -1
    rewrite.optimizers.extend(GRAPPLER_OPTIMIZERS)
    return tf_optimizer.OptimizeGraph(config, meta_graph)


def function_from_graph_def(func, graph_def, input_names, output_names, captures=None):
    """A ConcreteFunction running `graph_def` with the signature of `func`.

    Input names, output names and nesting (dicts keep their key order), dtypes and shapes
    come from `func`; `input_names` are the graph's tensors fed by `func`'s flat inputs,
    `captures` maps further Placeholder names to outside tensors (captured by the function).
    """
    ctx = context.context()
    for f in graph_def.library.function:  # replace stale definitions of the same name, keep identical ones
        while ctx.has_function(f.signature.name) and ctx.get_function_def(f.signature.name) != f:
            ctx.remove_function(f.signature.name)

    def import_graph_def():
        tf.graph_util.import_graph_def(graph_def, name="")
        graph = tf.compat.v1.get_default_graph()
        for name, tensor in (captures or {}).items():
            graph.add_capture(tensor, graph.get_tensor_by_name(f"{name}:0"))

    wrapped = wrap_function.wrap_function(import_graph_def, [])
    element = wrapped.graph.as_graph_element
    fetches = nest.pack_sequence_as(func.structured_outputs, [element(n) for n in output_names])
    return wrapped.prune([element(n) for n in input_names], fetches,
                         input_signature=func.structured_input_signature)
