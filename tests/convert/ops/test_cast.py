"""Cast between float32, float16, int32 and bool is one Identity layer and matches TensorFlow."""
import numpy as np
import pytest
import tensorflow as tf

from reasons import check
from support import assert_converts, random_array

DTYPES = ["float32", "float16", "int32", "bool"]


@pytest.mark.parametrize("src", DTYPES)
@pytest.mark.parametrize("dst", DTYPES)
@pytest.mark.parametrize("shape", [(1, 5), (3, 2, 4)])
def test_cast(src, dst, shape):
    """Float to int rounds toward zero; anything to bool tests != 0; bool to numbers gives 0 or 1."""
    x = random_array(shape, src, high=50.0)
    engine = assert_converts(lambda t: tf.cast(t, dst) if src != dst else tf.identity(t), [x])
    if src != dst:
        assert [layer.kind for layer in engine.network.layers] == ["Identity"]


def test_float_to_int_truncates_negative_values_toward_zero():
    x = np.array([[-2.7, -0.5, 0.5, 2.7, 1e4]], np.float32)
    assert_converts(lambda t: tf.cast(t, tf.int32), [x], expect_kinds=["Identity"])


@pytest.mark.parametrize("dtype", [tf.float64, tf.int64, tf.uint8])
def test_unsupported_dtypes_are_refused(dtype):
    assert "not supported" in check(lambda t: tf.cast(t, dtype), [tf.TensorSpec((2, 3))], "Cast")
    assert "not supported" in check(lambda t: tf.cast(t, tf.float32), [tf.TensorSpec((2, 3), dtype)], "Cast")


def test_truncate_is_refused():
    fn = lambda t: tf.raw_ops.Cast(x=t, DstT=tf.float16, Truncate=True)
    assert "Truncate" in check(fn, [tf.TensorSpec((2, 3))], "Cast")
