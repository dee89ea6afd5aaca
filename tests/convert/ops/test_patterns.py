"""Activations and normalizations that TF and Keras emit as several ops convert op by op:
GELU (the Erfc form and the tanh form), swish/silu (with its IdentityN), LayerNormalization."""
import keras
import numpy as np
import pytest
import tensorflow as tf

from reasons import native_ops
from support import assert_converts, random_array

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
