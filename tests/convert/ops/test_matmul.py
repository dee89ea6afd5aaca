"""MatMul and BatchMatMul(V2, V3) become one MatrixMultiply layer with their transposes/adjoints, and match TF."""
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


BATCH_MATMULS = ["BatchMatMul", "BatchMatMulV2", "BatchMatMulV3"]


def batch_operand(batch, rows, cols, adjoint):
    return random_array((*batch, cols, rows) if adjoint else (*batch, rows, cols))


def batch_matmul(op, x, y, adj_x, adj_y):
    extra = {"Tout": x.dtype} if op == "BatchMatMulV3" else {}
    return getattr(tf.raw_ops, op)(x=x, y=y, adj_x=adj_x, adj_y=adj_y, **extra)


@pytest.mark.parametrize("op", BATCH_MATMULS)
@pytest.mark.parametrize("adj_x", [False, True])
@pytest.mark.parametrize("adj_y", [False, True])
@pytest.mark.parametrize("batch", [(1,), (3,), (2, 3)])
def test_batch_matmul(op, adj_x, adj_y, batch):
    """Same batch dims on both sides, with the adjoints of either operand."""
    fn = lambda a, b: batch_matmul(op, a, b, adj_x, adj_y)
    assert_converts(fn, [batch_operand(batch, 4, 5, adj_x), batch_operand(batch, 5, 3, adj_y)],
                    expect_kinds=["MatrixMultiply"])


@pytest.mark.parametrize("op", ["BatchMatMulV2", "BatchMatMulV3"])
@pytest.mark.parametrize("batch_x,batch_y", [((2, 3), (3,)), ((2, 1), (1, 4)), ((3,), ()), ((), (2, 3))])
@pytest.mark.parametrize("adj_x,adj_y", [(False, False), (True, True)])
def test_batch_matmul_broadcasts_batch_dims(op, batch_x, batch_y, adj_x, adj_y):
    fn = lambda a, b: batch_matmul(op, a, b, adj_x, adj_y)
    assert_converts(fn, [batch_operand(batch_x, 4, 5, adj_x), batch_operand(batch_y, 5, 3, adj_y)],
                    expect_kinds=["MatrixMultiply"])


@pytest.mark.parametrize("op", BATCH_MATMULS)
@pytest.mark.parametrize("const_first", [False, True])
@pytest.mark.parametrize("adj_x,adj_y", [(False, True), (True, False)])
def test_batch_matmul_constant_operand(op, const_first, adj_x, adj_y):
    """A constant on either side (BatchMatMulV2 broadcasts a rank-2 constant over the batch)."""
    a, b = batch_operand((2,), 4, 5, adj_x), batch_operand((2,) if op == "BatchMatMul" else (), 5, 3, adj_y)
    if const_first:
        fn, x = lambda t: batch_matmul(op, a, t, adj_x, adj_y), batch_operand((2,), 5, 3, adj_y)
    else:
        fn, x = lambda t: batch_matmul(op, t, b, adj_x, adj_y), a
    assert_converts(fn, [x], expect_kinds=["MatrixMultiply"])


def test_batch_matmul_v3_mixed_dtypes_are_refused():
    """float16 operands with a float32 result (traced only: TF's CPU build has no such kernel)."""
    fn = lambda a, b: tf.raw_ops.BatchMatMulV3(x=a, y=b, Tout=tf.float32)
    specs = [tf.TensorSpec((2, 3, 4), tf.float16), tf.TensorSpec((2, 4, 5), tf.float16)]
    view = GraphView(frozen_graph_def(fn, specs)[0])
    node = next(n for n in view.nodes.values() if n.op == "BatchMatMulV3")
    assert "mixed dtypes" in get_converter("BatchMatMulV3").check(node, ValidationContext(view))
