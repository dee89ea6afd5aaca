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


def _rewritten(fdef, change) -> function_pb2.FunctionDef:
    """A copy of `fdef` with change(node) applied to each node."""
    copy = function_pb2.FunctionDef()
    copy.CopyFrom(fdef)
    for node in copy.node_def:
        change(node)
    return copy


def test_digest_is_the_same_for_a_constant_written_as_a_saved_model_writes_it():
    """Saving compresses constants (a run of equal trailing values dropped, tensor_content as a value list)."""
    fdef = _fdef(lambda x: tf.matmul(x, tf.constant([[1.0, 2.0, 2.0]] * 4)) + tf.zeros([3]), [SPEC])

    def compress(node):
        if node.op == "Const":
            tensor = node.attr["value"].tensor
            values = tf.make_ndarray(tensor).ravel().tolist()
            while len(values) > 1 and values[-1] == values[-2]:
                values.pop()
            tensor.ClearField("tensor_content")
            tensor.ClearField("float_val")
            tensor.float_val.extend(values if any(values) else [])

    def expand(node):
        if node.op == "Const":
            tensor = node.attr["value"].tensor
            tensor.CopyFrom(tf.make_tensor_proto(tf.make_ndarray(tensor)))
            tensor.tensor_content = tf.make_ndarray(tensor).tobytes()
            tensor.ClearField("float_val")

    assert function_digest(_rewritten(fdef, compress)) == function_digest(_rewritten(fdef, expand)) == \
        function_digest(fdef)
    assert function_digest(_rewritten(fdef, expand)) != function_digest(
        _fdef(lambda x: tf.matmul(x, tf.constant([[1.0, 2.0, 3.0]] * 4)) + tf.zeros([3]), [SPEC]))


def test_digest_takes_an_attribute_at_its_default_for_an_absent_one():
    """Saving drops attributes at their op's default; loading puts them back."""
    fdef = _fdef(lambda x: tf.strided_slice(x, [1], [2], shrink_axis_mask=1), [SPEC])

    def strip(node):
        if node.op == "StridedSlice":
            for mask in ("begin_mask", "end_mask", "ellipsis_mask", "new_axis_mask"):
                assert node.attr[mask].i == 0
                del node.attr[mask]

    assert function_digest(_rewritten(fdef, strip)) == function_digest(fdef)
    assert function_digest(_fdef(lambda x: tf.strided_slice(x, [1], [2], shrink_axis_mask=1, begin_mask=1),
                                 [SPEC])) != function_digest(fdef)
