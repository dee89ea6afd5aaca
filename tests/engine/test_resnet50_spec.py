"""spec_from_network (tests/engine/gpu/gpu_resnet50.py) reads a ResNet-50 spec back from built engines:
the Network API's ResNet-50 after the builder and a plan round trip, and (slow) a converted Keras
ResNet-50 v1.5."""
import numpy as np
import pytest

from tftrt_py.engine import Builder, BuilderConfig, Runtime

import gpu_resnet50 as resnet50


def assert_same_spec(got, want):
    assert got["classes"] == want["classes"] and len(got["blocks"]) == len(want["blocks"])
    pairs = [(got["stem"], want["stem"])] + [(g, w) for gb, wb in zip(got["blocks"], want["blocks"])
                                             for g, w in zip(gb, wb)]
    for g, w in pairs:
        assert (g is None) == (w is None)
        if w is not None:
            assert {k: g[k] for k in ("name", "stride", "pad", "relu")} == \
                   {k: w[k] for k in ("name", "stride", "pad", "relu")}
            np.testing.assert_array_equal(g["kernel"], w["kernel"])
            np.testing.assert_array_equal(g["bias"], w["bias"])
    for g, w in zip(got["fc"], want["fc"]):
        np.testing.assert_array_equal(g, w)


@pytest.fixture
def built():
    model = resnet50.spec()
    return model, Builder(BuilderConfig(precision="FP32")).build_engine(resnet50.network(1, 64, model))


def test_spec_round_trips_through_the_builder_and_a_plan(built):
    model, engine = built
    assert_same_spec(resnet50.spec_from_network(engine.network), model)
    loaded = Runtime(backend="numpy").deserialize_cuda_engine(engine.serialize())
    assert_same_spec(resnet50.spec_from_network(loaded.network), model)


def test_residual_sum_fused_into_the_projection(built):
    """The first block's sum and ReLU moved from its last convolution into its projection shortcut."""
    model, engine = built
    c3 = next(layer for layer in engine.network.layers if len(layer.inputs) == 2)
    proj = c3.inputs[1].producer
    engine.network.replace_all_uses(c3.outputs[0], proj.outputs[0])
    c3.inputs, proj.inputs = c3.inputs[:1], [proj.inputs[0], c3.outputs[0]]
    proj.params["activation"] = c3.params.pop("activation")
    assert_same_spec(resnet50.spec_from_network(engine.network), model)


def test_other_networks_are_refused(built):
    from networks import conv_relu_pool_net

    with pytest.raises(ValueError, match="expected a MatrixMultiply producing 'TensorRTOutputPH_0', found Reduce"):
        resnet50.spec_from_network(conv_relu_pool_net())
    _, engine = built
    conv = next(layer for layer in engine.network.layers if layer.kind == "Convolution" and
                layer.weights["kernel"].shape[0] == 3)
    conv.params["post_padding"] = [0, 0]
    with pytest.raises(ValueError, match="padding \\[1, 1\\]/\\[0, 0\\] .* not symmetric"):
        resnet50.spec_from_network(engine.network)


@pytest.mark.slow
def test_spec_of_a_converted_keras_resnet50_v15(tmp_path):
    """The spec read from the converted Keras model's engine, rebuilt with the Network API, computes
    what Keras does."""
    import tensorflow as tf

    from models import resnet50_v15
    from tftrt_py import trt_convert as trt
    from tftrt_py.engine_op import dispatcher

    model = resnet50_v15.build(size=64)
    model.export(str(tmp_path), verbose=False)
    converter = trt.TrtGraphConverterV2(input_saved_model_dir=str(tmp_path))
    converter.convert()
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 64, 64, 3)).astype(np.float32)
    converter.build(input_fn=lambda: iter([(x,)]))
    (node,) = converter._engine_nodes()
    (engine,) = dispatcher.find(node.attr["segment_key"].s.decode()).engines()
    spec = resnet50.spec_from_network(engine.network)
    assert len(spec["blocks"]) == 16 and spec["classes"] == 1000
    assert [b[3] is not None for b in spec["blocks"]].count(True) == 4
    rebuilt = Builder().build_engine(resnet50.network(2, 64, spec))
    got = rebuilt.create_execution_context().execute({"input": x})["logits"]
    np.testing.assert_allclose(got, model(tf.constant(x)).numpy(), rtol=1e-4, atol=1e-4)
