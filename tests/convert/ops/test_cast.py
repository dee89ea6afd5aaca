"""Cast between float32, float16, int32, bool and int64 is one Identity layer, Bitcast between float32 and int32
one Bitcast layer; both match TensorFlow (Bitcast bit for bit)."""
import numpy as np
import pytest
import tensorflow as tf

from reasons import check
from support import assert_converts, random_array, run_engine

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


@pytest.mark.parametrize("dtype", [tf.float64, tf.uint8])
def test_unsupported_dtypes_are_refused(dtype):
    assert "not supported" in check(lambda t: tf.cast(t, dtype), [tf.TensorSpec((2, 3))], "Cast")
    assert "not supported" in check(lambda t: tf.cast(t, tf.float32), [tf.TensorSpec((2, 3), dtype)], "Cast")


def test_truncate_is_refused():
    fn = lambda t: tf.raw_ops.Cast(x=t, DstT=tf.float16, Truncate=True)
    assert "Truncate" in check(fn, [tf.TensorSpec((2, 3))], "Cast")


@pytest.mark.parametrize("precision", ["FP32", "FP16"])
@pytest.mark.parametrize("src, dst", [("float32", "int32"), ("int32", "float32")])
def test_bitcast_keeps_the_bits(src, dst, precision):
    """float32 <-> int32 reinterprets: negative zero, inf and nan bits come through unchanged (FP16 engines too:
    a bitcast never runs in fp16)."""
    x = random_array((2, 3, 4), src)
    x.reshape(-1)[:3] = np.array([-0.0, np.inf, np.nan], "float32").view(src)
    fn = lambda t: tf.bitcast(t, dst)
    engine, (got,) = run_engine(fn, [x], precision=precision)
    want = np.asarray(fn(tf.constant(x)))
    assert got.dtype == want.dtype and got.tobytes() == want.tobytes()
    assert "Bitcast" in {layer.kind for layer in engine.network.layers}


def test_bitcast_to_another_item_size_is_refused():
    reason = check(lambda t: tf.bitcast(t, tf.int16), [tf.TensorSpec((2, 3))], "Bitcast")
    assert reason == "Bitcast with type=int16 is not supported (supported: float32, int32)"


@pytest.mark.parametrize("src, dst", [("int32", "int64"), ("int64", "int32"), ("int64", "float32"),
                                      ("float32", "int64"), ("bool", "int64")])
def test_int64_casts(src, dst):
    assert_converts(lambda t: tf.cast(t, dst), [random_array((2, 3), src)], expect_kinds=["Identity"])
