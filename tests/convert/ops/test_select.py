"""SelectV2 broadcasts its three operands; Select picks rows with a vector condition; MatrixBandPart keeps a band
of each matrix. All match TF."""
import numpy as np
import pytest
import tensorflow as tf

from reasons import check
from support import assert_converts, random_array, run_engine

SHAPES = [((2, 3, 4), (2, 3, 4), (2, 3, 4)), ((4,), (2, 3, 4), (1, 3, 1)), ((2, 1, 1), (1, 4), (2, 3, 4)),
          ((1, 1), (1, 5), ())]


@pytest.mark.parametrize("shapes", SHAPES)
@pytest.mark.parametrize("dtype", ["float32", "int32", "bool"])
def test_select_v2_broadcasts(shapes, dtype):
    cond, a, b = random_array(shapes[0], "bool"), random_array(shapes[1], dtype), random_array(shapes[2], dtype)
    assert_converts(lambda c, x, y: tf.raw_ops.SelectV2(condition=c, t=x, e=y), [cond, a, b],
                    expect_kinds=["Select"])


@pytest.mark.parametrize("cond_shape", [(3,), (3, 4, 2)])
@pytest.mark.parametrize("batch", [1, 3])
def test_select_by_rows_or_elements(cond_shape, batch):
    cond_shape = (batch,) + cond_shape[1:]
    cond, a, b = random_array(cond_shape, "bool"), random_array((batch, 4, 2)), random_array((batch, 4, 2))
    assert_converts(lambda c, x, y: tf.raw_ops.Select(condition=c, x=x, y=y), [cond, a, b], expect_kinds=["Select"])


def test_where_of_a_comparison():
    """Keras Embedding's index wrap: where(ids < 0, ids + n, ids) on int32."""
    fn = lambda ids: tf.where(ids < 3, ids + 100, ids)
    assert_converts(fn, [random_array((2, 7), "int32")], expect_kinds=["Select"])


def test_select_needs_known_ranks():
    fn = lambda c, x, y: tf.raw_ops.Select(condition=c, x=x, y=y)
    specs = [tf.TensorSpec(None, tf.bool), tf.TensorSpec(None), tf.TensorSpec(None)]
    assert "rank" in check(fn, specs, "Select")


@pytest.mark.parametrize("lower,upper", [(-1, 0), (0, -1), (1, 2), (0, 0), (-1, -1), (4, 5)])
@pytest.mark.parametrize("dtype", ["float32", "float16", "int32", "bool"])
def test_band_part(lower, upper, dtype):
    """Lower and upper triangles, a band, the diagonal, everything, and bounds equal to the matrix sizes."""
    fn = lambda x: tf.linalg.band_part(x, lower, upper)
    assert_converts(fn, [random_array((2, 3, 4, 5), dtype)], rtol=0, atol=0)


def test_band_part_keeps_nan_and_zeroes_outside_the_band():
    """Outside the band the result is 0 (not x * 0: no NaN, no -0)."""
    x = np.full((1, 3, 3), np.nan, np.float32)
    x[0, 0, 0] = -1.5
    _, (got,) = run_engine(lambda t: tf.linalg.band_part(t, 0, 0), [x])
    np.testing.assert_array_equal(got, tf.linalg.band_part(x, 0, 0).numpy())
    assert not np.signbit(got[0, 0, 1])


@pytest.mark.parametrize("batch", [1, 3])
def test_causal_mask_from_the_sequence_length(batch):
    """num_lower and num_upper computed from tf.shape, and a band of ones of [S, S] built from it."""
    def fn(x):
        s = tf.shape(x)[-1]
        return x * tf.linalg.band_part(tf.ones([s, s]), -1, 0) + tf.linalg.band_part(x, s - 2, s // 4)

    assert_converts(fn, [random_array((batch, 6, 6))], expect_kinds=["Select"])


def test_band_part_in_fp16():
    x = random_array((2, 4, 4))
    _, (got,) = run_engine(lambda t: tf.linalg.band_part(t, 1, 0) * 3.0, [x], precision="FP16")
    np.testing.assert_allclose(got, tf.linalg.band_part(x, 1, 0).numpy() * 3.0, rtol=1e-2, atol=1e-2)


def test_band_part_needs_a_matrix():
    assert "rank >= 2" in check(lambda x: tf.linalg.band_part(x, 1, 1), [tf.TensorSpec((4,))], "MatrixBandPart")


def test_band_part_bounds_past_the_matrix_are_refused():
    reason = check(lambda x: tf.linalg.band_part(x, 5, 0), [tf.TensorSpec((2, 4, 4))], "MatrixBandPart")
    assert "exceed" in reason
