"""Small engine networks built directly with the Network API, shared by the engine tests."""
import numpy as np

from tftrt_py.engine import Network


def conv_relu_pool_net(batch=4):
    """input [batch, 8, 8, 3] -> conv 3x3 (bias, relu) -> 2x2 avg pool -> mean over H, W."""
    rng = np.random.default_rng(0)
    net = Network("conv_net")
    x = net.add_input("TensorRTInputPH_0", "float32", (batch, 8, 8, 3))
    conv = net.add_layer("Convolution", [x], dict(strides=[1, 1], dilations=[1, 1], pre_padding=[1, 1],
                                                  post_padding=[1, 1], groups=1, activation={"type": "relu"}),
                         {"kernel": rng.standard_normal((3, 3, 3, 5)).astype("float32"),
                          "bias": rng.standard_normal(5).astype("float32")}, name="conv")
    pool = net.add_layer("Pooling", conv.outputs, dict(type="avg", window=[2, 2], strides=[2, 2],
                                                       pre_padding=[0, 0], post_padding=[0, 0]), name="pool")
    mean = net.add_layer("Reduce", pool.outputs, dict(op="mean", axes=[1, 2], keep_dims=False), name="mean")
    net.mark_output(mean.outputs[0], name="TensorRTOutputPH_0")
    return net
