"""Activations and normalizations that TF and Keras emit as several ops convert op by op:
GELU (the Erfc form and the tanh form), swish/silu (with its IdentityN), LayerNormalization, and the attention
masks of keras-hub transformers (padding masks broadcast over heads, causal masks from ranges or band_part)."""
import keras
import numpy as np
import pytest
import tensorflow as tf

from reasons import native_ops
from support import assert_converts, random_array, run_engine

ACTIVATIONS = {
    "tf.nn.gelu": tf.nn.gelu,
    "tf.nn.gelu approximate": lambda t: tf.nn.gelu(t, approximate=True),
    "keras gelu": keras.activations.gelu,
    "keras gelu approximate": lambda t: keras.activations.gelu(t, approximate=True),
    "tf.nn.silu": tf.nn.silu,
    "tf.nn.swish beta": lambda t: tf.nn.silu(t, beta=1.5),
    "keras silu": keras.activations.silu,
    "x * sigmoid(x)": lambda t: t * tf.sigmoid(t),
}


@pytest.mark.parametrize("name", sorted(ACTIVATIONS))
@pytest.mark.parametrize("shape", [(1, 9), (3, 4, 8)])
def test_activation_patterns_convert_op_by_op(name, shape):
    fn = ACTIVATIONS[name]
    assert native_ops(fn, [tf.TensorSpec((None,) + shape[1:])]) == {}
    assert_converts(fn, [random_array(shape, high=6.0)])


def test_erfc_keeps_its_tail_accurate():
    """GELU's Erfc form: erfc(x) for large x is tiny, and must be right relative to its size."""
    x = np.linspace(-4.0, 9.0, 131, dtype=np.float32).reshape(1, -1)
    assert_converts(tf.math.erfc, [x], rtol=2e-6, atol=0)


@pytest.mark.parametrize("axis", [-1, [1, 2], [-3, -1]])
@pytest.mark.parametrize("center,scale", [(True, True), (False, True), (True, False)])
@pytest.mark.parametrize("batch", [1, 3])
def test_keras_layer_normalization(axis, center, scale, batch):
    """Keras 3 emits Mean, SquaredDifference, Mean, AddV2, Rsqrt, Mul, Neg and AddV2 (plus Reshapes of gamma and
    beta, and StopGradient): every one converts."""
    layer = keras.layers.LayerNormalization(axis=axis, center=center, scale=scale, epsilon=1e-3)
    layer.build((None, 4, 5, 6))
    for w in layer.weights:
        w.assign(random_array(w.shape))
    fn = lambda t: layer(t)
    assert native_ops(fn, [tf.TensorSpec((None, 4, 5, 6))]) == {}
    assert_converts(fn, [random_array((batch, 4, 5, 6))], rtol=1e-4, atol=1e-5)


def test_dense_with_gelu_on_a_sequence():
    """Keras Dense on [B, T, C] is a Tensordot: Shape, GatherV2, Prod, Pack, Reshape, MatMul, Reshape (its
    constant transpose folded away by grappler, as in TrtGraphConverterV2)."""
    dense = keras.layers.Dense(6, activation="gelu")
    dense.build((None, 5, 4))
    fn = lambda t: dense(t)
    assert native_ops(fn, [tf.TensorSpec((None, 5, 4))], grappler=True) == {}
    assert_converts(fn, [random_array((2, 5, 4))], rtol=1e-5, atol=1e-5)


def additive_padding_mask(scores, mask, big=-1e9):
    """BERT-style: a [B, S] int mask broadcast to [B, heads, S, S] and made additive: (1 - mask) * -1e9."""
    b, s = tf.shape(scores)[0], tf.shape(scores)[-1]
    m = tf.cast(tf.broadcast_to(mask[:, None, None, :], [b, tf.shape(scores)[1], s, s]), scores.dtype)
    return tf.nn.softmax(scores + (1.0 - m) * big)


def where_padding_mask(scores, mask):
    """Keras-style: where(mask, scores, -inf), plus reduce_all/reduce_any over the mask (rows with no token)."""
    m = tf.broadcast_to(tf.cast(mask, tf.bool)[:, None, None, :], tf.shape(scores))
    masked = tf.where(m, scores, tf.fill(tf.shape(scores), tf.constant(float("-inf"), scores.dtype)))
    return masked, tf.reduce_all(m, axis=-1), tf.reduce_any(m, axis=[1, -1], keepdims=True)


def causal_mask(scores, mask, big=-1e9):
    """GPT-2/Llama-style: i >= j from two ranges, combined with the padding mask, and band_part's triangle."""
    s = tf.shape(scores)[-1]
    causal = tf.range(s)[:, None] >= tf.range(s)[None, :]
    keep = tf.logical_and(causal[None, None], tf.cast(mask, tf.bool)[:, None, None, :])
    lower = tf.linalg.band_part(tf.ones([s, s], scores.dtype), -1, 0)
    return tf.where(keep, scores, big) * lower + tf.cast(tf.abs(-mask[:, None, None, :]), scores.dtype)


MASKS = {"additive padding": additive_padding_mask, "where padding": where_padding_mask, "causal": causal_mask}


def mask_inputs(batch, heads=2, seq=6):
    mask = np.ones((batch, seq), np.int32)
    mask[:, seq - 2:] = 0  # padding at the end of every row
    mask[0, 1] = 0
    return [random_array((batch, heads, seq, seq)), mask]


@pytest.mark.parametrize("name", sorted(MASKS))
@pytest.mark.parametrize("batch", [1, 3])
def test_attention_masks_convert_into_one_engine(name, batch):
    fn = MASKS[name]
    specs = [tf.TensorSpec((None, 2, None, None)), tf.TensorSpec((None, None), tf.int32)]
    assert native_ops(fn, specs, grappler=True) == {}
    assert_converts(fn, mask_inputs(batch))


@pytest.mark.parametrize("name", ["additive padding", "causal"])
def test_attention_masks_in_fp16(name):
    """With the mask value Keras uses in fp16 (-1e9 is -inf in fp16, and 0 * -inf is NaN)."""
    fn = lambda scores, mask: MASKS[name](scores, mask, big=-3e4)
    inputs = mask_inputs(2)
    _, outs = run_engine(fn, inputs, precision="FP16")
    np.testing.assert_allclose(outs[0], fn(*[tf.constant(x) for x in inputs]).numpy(), rtol=1e-2, atol=1e-2)
