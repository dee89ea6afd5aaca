"""Activation ops become one Activation layer and match TensorFlow."""
import pytest
import tensorflow as tf

from support import assert_converts, random_array

OPS = {
    "Relu": tf.nn.relu, "Relu6": tf.nn.relu6, "Sigmoid": tf.sigmoid, "Tanh": tf.tanh, "Elu": tf.nn.elu,
    "Selu": tf.nn.selu, "Softplus": tf.nn.softplus, "Softsign": tf.nn.softsign,
    "LeakyRelu": lambda x: tf.nn.leaky_relu(x, alpha=0.3),
}


@pytest.mark.parametrize("op", sorted(OPS))
@pytest.mark.parametrize("shape", [(1, 7), (3, 4, 5, 6)])
def test_activation_matches_tf(op, shape):
    assert_converts(OPS[op], [random_array(shape, high=8.0)], expect_kinds=["Activation"])
