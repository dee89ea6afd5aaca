"""SpaceToBatchND and BatchToSpaceND convert to layers that only move entries, exact in every dtype; a dilated
convolution, which TF writes as SpaceToBatchND -> Conv2D (or DepthwiseConv2dNative) -> BatchToSpaceND, becomes one
dilated Convolution in the engine."""
import keras
import numpy as np
import pytest
import tensorflow as tf

from reasons import check
from support import assert_converts, random_array


@pytest.mark.parametrize("block, paddings", [([2, 2], [[1, 2], [0, 1]]), ([3, 1], [[1, 1], [0, 0]]),
                                             ([2, 3], [[0, 1], [0, 0]]), ([1, 3], [[0, 0], [0, 0]])])
@pytest.mark.parametrize("dtype", ["float32", "float16", "int32"])
def test_space_to_batch(block, paddings, dtype):
    assert_converts(lambda t: tf.space_to_batch_nd(t, block, paddings), [random_array((2, 7, 9, 3), dtype)],
                    rtol=0, atol=0)


@pytest.mark.parametrize("block, crops", [([2, 2], [[1, 0], [0, 2]]), ([3, 1], [[0, 0], [0, 0]]),
                                          ([2, 3], [[1, 1], [2, 0]])])
@pytest.mark.parametrize("dtype", ["float32", "int32"])
def test_batch_to_space(block, crops, dtype):
    x = random_array((int(np.prod(block)) * 2, 4, 5, 3), dtype)
    assert_converts(lambda t: tf.batch_to_space(t, block, crops), [x], rtol=0, atol=0)


def test_one_spatial_dim_and_trailing_dims():
    x = random_array((2, 8, 3, 2))
    assert_converts(lambda t: tf.batch_to_space(tf.space_to_batch_nd(t, [4], [[1, 3]]) * 2.0, [4], [[1, 3]]), [x])


def test_run_time_block_shapes_are_refused():
    fn = lambda t, b: tf.raw_ops.SpaceToBatchND(input=t, block_shape=b, paddings=[[0, 0], [0, 0]])
    reason = check(fn, [tf.TensorSpec((1, 4, 4, 3)), tf.TensorSpec((2,), tf.int32)], "SpaceToBatchND")
    assert "must be a constant" in reason


DILATED = {
    "tf.nn.convolution": lambda w: lambda t: tf.nn.convolution(t, w, dilations=2, padding="SAME"),
    "tf.nn.atrous_conv2d valid": lambda w: lambda t: tf.nn.atrous_conv2d(t, w, rate=3, padding="VALID"),
    "depthwise": lambda w: lambda t: tf.nn.depthwise_conv2d(t, w[..., :1], strides=[1, 1, 1, 1], padding="SAME",
                                                            dilations=[2, 3]),
}


@pytest.mark.parametrize("name", sorted(DILATED))
@pytest.mark.parametrize("batch", [1, 3])
def test_a_dilated_convolution_becomes_one_dilated_convolution_layer(name, batch):
    w = tf.constant(random_array((3, 3, 4, 5)))
    engine = assert_converts(DILATED[name](w), [random_array((batch, 13, 11, 4))], expect_kinds=["Convolution"])
    (conv,) = [l for l in engine.network.layers if l.kind == "Convolution"]
    assert max(conv.params["dilations"]) > 1


def test_a_keras_dilated_convolution_with_bias_and_activation_is_one_layer():
    layer = keras.layers.Conv2D(6, 3, dilation_rate=2, padding="same", activation="relu")
    layer.build((None, 12, 12, 4))
    engine = assert_converts(lambda t: layer(t), [random_array((2, 12, 12, 4))], expect_kinds=["Convolution"])
    (conv,) = engine.network.layers
    assert conv.params["dilations"] == [2, 2] and conv.params["activation"]["type"] == "relu"
