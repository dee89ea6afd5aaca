"""precision FP8 on the cupy backend: on a GPU of compute capability 8.9+ an FP8 engine builds, its FP8 layers
run in FP16 (said in layer.precision, so the numpy backend computes the same), and its outputs match the numpy
backend's; below 8.9 the build fails saying what to use instead."""
import numpy as np
import pytest

from tftrt_py.engine import Builder, BuilderConfig, Network
from tftrt_py.engine.errors import BuildError

from gpu_helpers import GPU, healthy_gpu  # noqa: F401 (autouse fixture)

pytestmark = GPU


def conv_dense_net():
    rng = np.random.default_rng(3)
    net = Network("fp8_net")
    x = net.add_input("x", "float32", (8, 16, 16, 32))
    conv = net.add_layer("Convolution", [x], dict(strides=[1, 1], dilations=[1, 1], pre_padding=[1, 1],
                                                  post_padding=[1, 1], groups=1, activation={"type": "relu"}),
                         {"kernel": (rng.standard_normal((3, 3, 32, 32)) * 0.1).astype("float32"),
                          "bias": rng.standard_normal(32).astype("float32")}, name="conv")
    mean = net.add_layer("Reduce", conv.outputs, dict(op="mean", axes=[1, 2], keep_dims=False), name="mean")
    w = net.add_constant(rng.standard_normal((32, 16)).astype("float32"), name="w")
    mm = net.add_layer("MatrixMultiply", [mean.outputs[0], w], {}, name="mm")
    net.mark_output(mm.outputs[0], name="y")
    x.dynamic_range, mean.outputs[0].dynamic_range = 4.0, 2.0
    return net


def test_fp8_engine_on_this_gpu():
    import cupy

    capability = cupy.cuda.Device().compute_capability
    builder = Builder(BuilderConfig(precision="FP8", backend="cupy"))
    if int(capability) < 89:
        with pytest.raises(BuildError, match="precision FP8 needs a GPU of compute capability 8.9 or later"):
            builder.build_engine(conv_dense_net()).create_execution_context()
        return
    engine = builder.build_engine(conv_dense_net())
    ctx = engine.create_execution_context()
    assert "FP8" not in {layer.precision for layer in engine.network.layers}  # FP16 until FP8 kernels land
    reference = Builder(BuilderConfig(precision="FP16")).build_engine(conv_dense_net()).create_execution_context()
    rng = np.random.default_rng(4)
    for _ in range(2):
        x = rng.uniform(-4, 4, (8, 16, 16, 32)).astype("float32")
        got, want = ctx.execute({"x": x})["y"], reference.execute({"x": x})["y"]
        assert np.isfinite(got).all()
        np.testing.assert_allclose(got, want, rtol=1e-2, atol=1e-2)
