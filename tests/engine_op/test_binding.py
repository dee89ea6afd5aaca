"""The engine binding digest: fixed by what the segment computes, not by how its function is serialized."""
from __future__ import annotations

import tensorflow as tf
from tensorflow.core.framework import function_pb2

from tftrt_py.engine_op.binding import function_digest


def _fdef(fn, specs) -> function_pb2.FunctionDef:
    return tf.function(fn).get_concrete_function(*specs).function_def


SPEC = tf.TensorSpec([None, 4], tf.float32)


def _model(x):
    return tf.nn.relu(tf.matmul(x, tf.ones([4, 3])) + 1.0)


def test_digest_ignores_node_order_and_names():
    fdef = _fdef(_model, [SPEC])
    shuffled = function_pb2.FunctionDef()
    shuffled.CopyFrom(fdef)
    nodes = list(shuffled.node_def)[::-1]
    renames = {n.name: f"renamed_{i}" for i, n in enumerate(nodes)}

    def rename(ref):
        control = ref.startswith("^")
        head, sep, tail = ref.lstrip("^").partition(":")
        return ("^" if control else "") + renames.get(head, head) + sep + tail

    del shuffled.node_def[:]
    for node in nodes:
        node.name = renames[node.name]
        node.input[:] = [rename(r) for r in node.input]
        node.device = "/job:localhost/replica:0/task:0/device:CPU:0"
        node.attr["_output_shapes"].list.shape.add()
        shuffled.node_def.add().CopyFrom(node)
    for key in list(shuffled.ret):
        shuffled.ret[key] = rename(shuffled.ret[key])
    shuffled.signature.name = "another_name_42"
    assert function_digest(shuffled) == function_digest(fdef)


def test_digest_changes_with_the_computation():
    base = function_digest(_fdef(_model, [SPEC]))
    assert function_digest(_fdef(lambda x: tf.nn.relu(tf.matmul(x, tf.ones([4, 3])) + 2.0),
                                        [SPEC])) != base
    assert function_digest(_fdef(lambda x: tf.nn.relu6(tf.matmul(x, tf.ones([4, 3])) + 1.0),
                                        [SPEC])) != base
    assert function_digest(_fdef(lambda x: tf.nn.relu(tf.matmul(tf.ones([3, 4]), x, transpose_b=True)
                                                                   + 1.0), [SPEC])) != base


def test_digest_tells_operand_order_apart():
    a = function_digest(_fdef(lambda x, y: x - y, [SPEC, SPEC]))
    b = function_digest(_fdef(lambda x, y: y - x, [SPEC, SPEC]))
    assert a != b
