"""TopKV2 becomes one TopK layer (values and int32 indices) and matches TensorFlow."""
import numpy as np
import pytest
import tensorflow as tf

from support import assert_converts, frozen_graph_def, random_array, run_engine
from tftrt_py.convert.context import ValidationContext
from tftrt_py.convert.graph import GraphView
from tftrt_py.convert.ops import get_converter


def check(fn, specs, op="TopKV2"):
    """The reason the converter gives for the first `op` node of `fn` traced with `specs`."""
    view = GraphView(frozen_graph_def(fn, specs)[0])
    node = next(n for n in view.nodes.values() if n.op == op)
    return get_converter(op).check(node, ValidationContext(view))


@pytest.mark.parametrize("shape", [(7,), (2, 9), (1, 3, 6)])
@pytest.mark.parametrize("k", [1, 3, 6])
def test_top_k(shape, k):
    fn = lambda t: tuple(tf.raw_ops.TopKV2(input=t, k=k))
    assert_converts(fn, [random_array(shape)], expect_kinds=["TopK"])


def test_k_equal_to_the_last_dim_and_int32_ties():
    """Ties go to the lower index first, as in TF (int32 values 1..9 repeat)."""
    fn = lambda t: tuple(tf.raw_ops.TopKV2(input=t, k=12))
    assert_converts(fn, [random_array((3, 12), "int32")], expect_kinds=["TopK"])


def test_unsorted():
    """sorted=False leaves the order to the implementation: compare as sets of (index, value)."""
    x = random_array((2, 8))
    fn = lambda t: tuple(tf.raw_ops.TopKV2(input=t, k=4, sorted=False))
    _, (values, idx) = run_engine(fn, [x])
    want_values, want_idx = fn(tf.constant(x))
    for row in range(2):
        got = sorted(zip(idx[row].tolist(), values[row].tolist()))
        want = sorted(zip(want_idx[row].numpy().tolist(), want_values[row].numpy().tolist()))
        assert got == want


def test_values_feed_other_layers():
    x = random_array((4, 10))
    fn = lambda t: tf.reduce_sum(tf.raw_ops.TopKV2(input=t, k=3).values, axis=-1)
    assert_converts(fn, [x], expect_kinds=["TopK"])


def test_nonconstant_k_is_refused():
    fn = lambda t, k: tuple(tf.raw_ops.TopKV2(input=t, k=k))
    assert check(fn, [tf.TensorSpec((2, 5)), tf.TensorSpec((), tf.int32)]) == "input 1 of TopKV2 must be a constant"


def test_int64_indices_are_refused():
    fn = lambda t: tuple(tf.raw_ops.TopKV2(input=t, k=2, index_type=tf.int64))
    assert "index_type=int64" in check(fn, [tf.TensorSpec((2, 5))])


@pytest.mark.parametrize("precision", ["FP16", "INT8"])
def test_reduced_precision_keeps_the_indices_of_near_ties(precision):
    """Values 1e-4 apart are equal in fp16: TopK reads its fp32 input unrounded, so indices match TF."""
    x = (1.0 + 1e-4 * tf.random.shuffle(tf.range(64, dtype=tf.float32))).numpy().reshape(4, 16)
    fn = lambda t: tuple(tf.raw_ops.TopKV2(input=t, k=5))
    engine, (values, idx) = run_engine(fn, [x], precision=precision)
    want_values, want_idx = fn(tf.constant(x))
    np.testing.assert_array_equal(idx, want_idx.numpy())
    np.testing.assert_array_equal(values, want_values.numpy())
    assert {l.precision for l in engine.network.layers if l.kind == "TopK"} == {"FP32"}
