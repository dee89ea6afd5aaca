"""Keras applications (weights=None) convert with >= 90% of their ops in engines and match TF within 1e-4."""
import numpy as np
import pytest
import tensorflow as tf

from support import random_array
from tftrt_py import trt_convert as trt
from tftrt_py.converters.summary import conversion_ratio


@pytest.mark.slow
@pytest.mark.parametrize("name", ["resnet50", "mobilenet_v2", "inception_v3", "vgg16"])
def test_application_converts_and_matches(saved_model, name):
    model_dir = saved_model(name)
    converter = trt.TrtGraphConverterV2(input_saved_model_dir=model_dir)
    func = converter.convert()
    inside, total = conversion_ratio(converter._converted_graph_def)
    print(f"{name}: {100.0 * inside / total:.2f}% of ops in engines [{inside}/{total}]")
    assert inside / total >= 0.9, converter._report.format()
    native = tf.saved_model.load(model_dir).signatures["serving_default"]
    (key, spec), = native.structured_input_signature[1].items()
    x = tf.constant(random_array([2] + spec.shape.as_list()[1:]))
    want, got = native(**{key: x}), func(**{key: x})
    for out in want:
        np.testing.assert_allclose(got[out].numpy(), want[out].numpy(), rtol=1e-4, atol=1e-4)
    stats = trt.engine_op_stats()
    assert all(stats[n.name]["fallback_total"] == 0 for n in converter._converted_graph_def.node
               if n.op == "TRTEngineOp")
