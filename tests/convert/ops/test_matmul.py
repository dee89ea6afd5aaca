"""MatMul becomes one MatrixMultiply layer with its transposes, and matches TensorFlow."""
import pytest
import tensorflow as tf

from support import assert_converts, frozen_graph_def, random_array
from tftrt_py.convert.context import ValidationContext
from tftrt_py.convert.graph import GraphView
from tftrt_py.convert.ops import get_converter


def operand(rows, cols, transpose):
    return random_array((cols, rows) if transpose else (rows, cols))


@pytest.mark.parametrize("transpose_a", [False, True])
@pytest.mark.parametrize("transpose_b", [False, True])
@pytest.mark.parametrize("batch", [1, 3])
def test_two_tensors(transpose_a, transpose_b, batch):
    fn = lambda a, b: tf.raw_ops.MatMul(a=a, b=b, transpose_a=transpose_a, transpose_b=transpose_b)
    assert_converts(fn, [operand(batch, 4, transpose_a), operand(4, 5, transpose_b)],
                    expect_kinds=["MatrixMultiply"])


@pytest.mark.parametrize("transpose_a", [False, True])
@pytest.mark.parametrize("transpose_b", [False, True])
@pytest.mark.parametrize("const_first", [False, True])
def test_constant_operand(transpose_a, transpose_b, const_first):
    """Either operand may be a constant (a dense layer's weights are the second)."""
    a, b = operand(2, 4, transpose_a), operand(4, 5, transpose_b)
    if const_first:
        fn, x = lambda t: tf.raw_ops.MatMul(a=a, b=t, transpose_a=transpose_a, transpose_b=transpose_b), b
    else:
        fn, x = lambda t: tf.raw_ops.MatMul(a=t, b=b, transpose_a=transpose_a, transpose_b=transpose_b), a
    assert_converts(fn, [x], expect_kinds=["MatrixMultiply"])


def test_int32_is_refused():
    fn = lambda a, b: tf.matmul(a, b)
    view = GraphView(frozen_graph_def(fn, [tf.TensorSpec((2, 3), tf.int32), tf.TensorSpec((3, 4), tf.int32)])[0])
    node = next(n for n in view.nodes.values() if n.op == "MatMul")
    assert "int32" in get_converter("MatMul").check(node, ValidationContext(view))
