"""Element-wise ops broadcast like TensorFlow, with the constant on either side; AddN and ClipByValue."""
import numpy as np
import pytest
import tensorflow as tf

from support import assert_converts, frozen_graph_def, random_array
from tftrt_py.convert.context import ValidationContext
from tftrt_py.convert.graph import GraphView
from tftrt_py.convert.ops import get_converter
from tftrt_py.convert.ops.elementwise import INT64_EXACT, INT_EXACT

OPS = {"Add": tf.raw_ops.Add, "AddV2": tf.raw_ops.AddV2, "Sub": tf.raw_ops.Sub, "Mul": tf.raw_ops.Mul,
       "RealDiv": tf.raw_ops.RealDiv, "Div": tf.raw_ops.Div, "Maximum": tf.raw_ops.Maximum,
       "Minimum": tf.raw_ops.Minimum, "SquaredDifference": tf.raw_ops.SquaredDifference}


@pytest.mark.parametrize("op", sorted(OPS))
@pytest.mark.parametrize("other_shape", [(2, 3, 4), (4,), (1, 3, 1)])
def test_two_tensors_broadcast(op, other_shape):
    fn = lambda a, b: OPS[op](x=a, y=b)
    assert_converts(fn, [random_array((2, 3, 4)), random_array(other_shape)], expect_kinds=["ElementWise"])


@pytest.mark.parametrize("op", sorted(OPS))
@pytest.mark.parametrize("const_first", [False, True])
def test_constant_on_either_side(op, const_first):
    c = tf.constant(random_array((3, 1)))
    fn = (lambda a: OPS[op](x=c, y=a)) if const_first else (lambda a: OPS[op](x=a, y=c))
    assert_converts(fn, [random_array((2, 3, 4))], expect_kinds=["ElementWise"])


def test_pow_on_positive_base():
    assert_converts(lambda a, b: tf.pow(a, b), [random_array((4, 5), positive=True), random_array((5,))],
                    expect_kinds=["ElementWise"])


FLOOR_OPS = {"FloorDiv": tf.raw_ops.FloorDiv, "FloorMod": tf.raw_ops.FloorMod}


def signed_ints(shape):
    """Non-zero int32 values of both signs (floor division and modulo differ from truncation there)."""
    return random_array(shape, "int32") * np.where(random_array(shape) > 0, 1, -1).astype("int32")


@pytest.mark.parametrize("op", sorted(FLOOR_OPS))
@pytest.mark.parametrize("dtype", ["float32", "int32"])
@pytest.mark.parametrize("other_shape", [(2, 3, 4), (4,), (3, 1)])
def test_floor_div_and_mod(op, dtype, other_shape):
    """Negative operands round towards -inf; floats and int32, broadcasting."""
    make = signed_ints if dtype == "int32" else random_array
    fn = lambda a, b: FLOOR_OPS[op](x=a, y=b)
    assert_converts(fn, [make((2, 3, 4)), make(other_shape)], expect_kinds=["ElementWise"])


@pytest.mark.parametrize("op", sorted(FLOOR_OPS))
@pytest.mark.parametrize("const_first", [False, True])
def test_floor_ops_constant_on_either_side(op, const_first):
    c = tf.constant(signed_ints((3, 1)))
    fn = (lambda a: FLOOR_OPS[op](x=c, y=a)) if const_first else (lambda a: FLOOR_OPS[op](x=a, y=c))
    assert_converts(fn, [signed_ints((2, 3, 4))], expect_kinds=["ElementWise"])


@pytest.mark.parametrize("count", [1, 2, 4])
@pytest.mark.parametrize("dtype", ["float32", "int32"])
def test_add_n(count, dtype):
    """N same-shaped tensors (and a constant among them) summed."""
    c = random_array((2, 3), dtype)
    fn = lambda *ts: tf.raw_ops.AddN(inputs=[*ts, c])
    assert_converts(fn, [random_array((2, 3), dtype) for _ in range(count)], expect_kinds=["ElementWise"])


@pytest.mark.parametrize("lo,hi", [(-0.5, 0.7), (0.0, 1.0), (-3.0, -1.0)])
def test_clip_by_value_scalar_constants(lo, hi):
    """Scalar constant bounds become one clip Activation."""
    fn = lambda t: tf.raw_ops.ClipByValue(t=t, clip_value_min=lo, clip_value_max=hi)
    assert_converts(fn, [random_array((2, 3, 4))], expect_kinds=["Activation"])


def test_clip_by_value_tensor_bounds():
    """Tensor bounds of t's shape (or broadcast scalars): a min then a max, like TF (lo > hi gives lo)."""
    fn = lambda t, lo, hi: tf.raw_ops.ClipByValue(t=t, clip_value_min=lo, clip_value_max=hi)
    x, lo, hi = random_array((2, 3)), random_array((2, 3)), random_array((2, 3))
    assert_converts(fn, [x, lo, hi], expect_kinds=["ElementWise"])


@pytest.mark.parametrize("lo,hi", [(2, 6), (7, 3)])
def test_clip_by_value_int32_and_crossed_bounds(lo, hi):
    fn = lambda t: tf.raw_ops.ClipByValue(t=t, clip_value_min=lo, clip_value_max=hi)
    assert_converts(fn, [random_array((3, 4), "int32")], expect_kinds=["ElementWise"])


INT_OPS = {op: getattr(tf.raw_ops, op) for op in INT_EXACT}


@pytest.mark.parametrize("op", sorted(INT_OPS))
@pytest.mark.parametrize("other_shape", [(2, 3, 4), (3, 1)])
def test_int32_ops_match_tf_bit_for_bit(op, other_shape):
    """Operands of both signs (Div truncates towards zero, FloorDiv and FloorMod round towards -inf)."""
    fn = lambda a, b: INT_OPS[op](x=a, y=b)
    assert_converts(fn, [signed_ints((2, 3, 4)), signed_ints(other_shape)], rtol=0, atol=0,
                    expect_kinds=["ElementWise"])


@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "SquaredDifference"])
def test_int32_overflow_wraps_as_in_tf(op):
    big = np.array([2 ** 31 - 1, -2 ** 31, 2 ** 30 + 7, -(2 ** 30) - 3, 123456789, -987654321], np.int32)
    fn = lambda a, b: INT_OPS[op](x=a, y=b)
    assert_converts(fn, [big, big[::-1].copy()], rtol=0, atol=0, expect_kinds=["ElementWise"])


def test_int32_real_div_is_refused():
    """Ops outside INT_EXACT stay float-only (integer RealDiv truncates; the engine's div would not)."""
    specs = [tf.TensorSpec((2, 3), tf.int32)] * 2
    view = GraphView(frozen_graph_def(lambda a, b: tf.raw_ops.RealDiv(x=a, y=b), specs)[0])
    node = next(n for n in view.nodes.values() if n.op == "RealDiv")
    assert "int32" in get_converter("RealDiv").check(node, ValidationContext(view))


@pytest.mark.parametrize("op", INT64_EXACT)
def test_int64_ops_match_tf_bit_for_bit(op):
    """Index arithmetic in int64: values beyond int32, sums that wrap at 2**63."""
    a = np.array([2 ** 40 + 3, -2 ** 35, 2 ** 63 - 1, 7, -9, 2 ** 31], np.int64)
    b = np.array([-5, 2 ** 33, 1, -2 ** 62, 4, 2 ** 31], np.int64)
    fn = lambda x, y: getattr(tf.raw_ops, op)(x=x, y=y)
    assert_converts(fn, [a, b], rtol=0, atol=0, expect_kinds=["ElementWise"])


def test_int64_constant_keeps_its_dtype():
    """An int64 constant operand stays int64 in the engine, on either side."""
    c = np.array([2 ** 33, -1, 3], np.int64)
    assert_converts(lambda x: (c + x, x - c), [np.array([[1, 2 ** 40, -3]], np.int64)], rtol=0, atol=0)


def test_int64_division_is_refused():
    """Divisions stay int32 (the engine divides in float; int64 quotients would round)."""
    specs = [tf.TensorSpec((2, 3), tf.int64)] * 2
    view = GraphView(frozen_graph_def(lambda a, b: tf.raw_ops.FloorDiv(x=a, y=b), specs)[0])
    node = next(n for n in view.nodes.values() if n.op == "FloorDiv")
    assert "int64" in get_converter("FloorDiv").check(node, ValidationContext(view))
