"""OneHot converts exactly (an equality with the class numbers and a Select), in every output dtype, along any
axis, with indices outside [0, depth) giving off_value, as in TF."""
import numpy as np
import pytest
import tensorflow as tf

from reasons import check
from support import assert_converts


def indices(shape, depth, dtype="int32", seed=0):
    """Class numbers in [-1, depth]: one below and one past the range included."""
    return np.random.default_rng(seed).integers(-1, depth + 1, shape).astype(dtype)


@pytest.mark.parametrize("axis", [-1, 0, 1, 2])
@pytest.mark.parametrize("dtype", ["float32", "float16", "int32", "bool"])
def test_one_hot(axis, dtype):
    on, off = (True, False) if dtype == "bool" else (3, -1)
    fn = lambda t: tf.one_hot(t, 5, on_value=tf.constant(on, dtype), off_value=tf.constant(off, dtype), axis=axis,
                              dtype=dtype)
    assert_converts(fn, [indices((2, 4), 5)], rtol=0, atol=0, expect_kinds=["Select"])


@pytest.mark.parametrize("batch", [1, 3])
def test_a_router_picking_experts_by_one_hot(batch):
    """Mixtral's router: top-k experts of each token as one-hot masks weighting the experts' outputs."""
    def route(x, logits):
        _, chosen = tf.math.top_k(logits, k=2)
        mask = tf.reduce_sum(tf.one_hot(chosen, 4, dtype=tf.float32), axis=-2)
        return x * mask
    rng = np.random.default_rng(1)
    x, logits = (rng.standard_normal((batch, 6, 4)).astype(np.float32) for _ in range(2))
    assert_converts(route, [x, logits])


def test_int64_indices():
    assert_converts(lambda t: tf.one_hot(t, 7), [indices((3,), 7, "int64")], rtol=0, atol=0)


def test_run_time_depth_is_refused():
    reason = check(lambda t, d: tf.one_hot(t, d), [tf.TensorSpec((2,), tf.int32), tf.TensorSpec((), tf.int32)],
                   "OneHot")
    assert "must be a constant" in reason
