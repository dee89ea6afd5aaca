"""Weights saved as constants, written into the SavedModel after TensorFlow's writer has written the rest.

A model saved with its weights as constants (convert.segment_weights, variables.reads_as_constants) holds them in
library functions made for that save. TensorFlow's SavedModel writer copies a function library several times on the
way to the file (registering each function in the eager context, exporting the graph, serializing the SavedModel):
for keras-hub BERT-base's 0.41 GB that took 16 s and 3.7 GB at the peak on a 2-vCPU host. So those functions go
through the writer with stand-ins for their weights (convert.graph), and :func:`write_weights` then puts the weights
into the written saved_model.pb, serializing them once, and writes its fingerprint.pb again.
"""
from __future__ import annotations

import os
from typing import Dict

from tensorflow.core.protobuf import saved_model_pb2
from tensorflow.python.lib.io import file_io
from tensorflow.python.saved_model import fingerprinting_utils

from tftrt_py.convert.graph import function_without_weights, restore_weights
from tftrt_py.convert.segment_weights import WEIGHTS_SUFFIX

__all__ = ["stand_in_weights", "write_weights"]

#: What the writer names the SavedModel's graph file, and the file of its checksums.
SAVED_MODEL_FILE, FINGERPRINT_FILE = "saved_model.pb", "fingerprint.pb"


def stand_in_weights(graph_def, weights_function: str) -> Dict[str, Dict[str, object]]:
    """Put stand-ins in place of the weights of the functions of `graph_def`'s library that exist for this save
    only: the native segment functions named by segment_weights.fresh_function_name and `weights_function` (that
    of variables.reads_as_constants). Returns function name -> its weights by node name (the Consts themselves).
    A function the converter's own converted function shares keeps its weights: TensorFlow runs functions by name,
    and a stand-in registered under that name would replace it there."""
    library = graph_def.library.function
    weights, stand_ins = {}, []
    for i in reversed(range(len(library))):
        name = library[i].signature.name
        if WEIGHTS_SUFFIX in name or name == weights_function:
            light, held = function_without_weights(library[i])
            if held:
                weights[name] = held
                stand_ins.append(light)
                del library[i]  # (its Consts stay as they are, held by `weights`)
    library.extend(stand_ins)
    return weights


def write_weights(export_dir: str, weights: Dict[str, Dict[str, object]]) -> None:
    """Put `weights` (from :func:`stand_in_weights`) into the functions of the same names in `export_dir`'s
    saved_model.pb, and write its fingerprint.pb again where the writer wrote one (it holds the file's checksum).
    The weights leave `weights` once copied into the file's graph, before it is serialized, so that the graph they
    came from can be freed first where nothing else holds it (a protobuf message's memory goes with all of it)."""
    if not weights:
        return
    path = os.path.join(export_dir, SAVED_MODEL_FILE)
    saved = saved_model_pb2.SavedModel.FromString(file_io.read_file_to_string(path, binary_mode=True))
    restored = set()
    for meta_graph in saved.meta_graphs:
        for fdef in meta_graph.graph_def.library.function:
            if fdef.signature.name in weights:
                restore_weights(fdef.node_def, weights[fdef.signature.name])
                restored.add(fdef.signature.name)
    missing = sorted(set(weights) - restored)
    weights.clear()
    if missing:  # the writer renamed or left out a function: the file would serve stand-ins
        raise RuntimeError(f"TensorFlow's SavedModel writer wrote no function {missing[0]!r} into {path}, so its "
                           f"weights have nowhere to go; save again with TFTRT_PY_KEEP_VARIABLES_BYTES=0 (weights "
                           f"as variables)")
    file_io.atomic_write_string_to_file(path, saved.SerializeToString(deterministic=True))
    if os.path.exists(os.path.join(export_dir, FINGERPRINT_FILE)):
        fingerprinting_utils.write_fingerprint(export_dir)
