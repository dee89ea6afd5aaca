"""Keras models built from the ops of the second converter batch convert through TrtGraphConverterV2
with >= 90% of their ops in engines and match TensorFlow within 1e-4.

A transformer encoder block (int32 tokens: Embedding's index wrap and GatherV2, MultiHeadAttention's
EinsumDense and Einsum, LayerNormalization, a Dense Tensordot with GELU), EfficientNetB0 (swish, the
squeeze-excite Reshape to a shape from tf.shape), DenseNet121 and NASNetMobile; weights=None, logits
(classifier_activation=None) rather than a near-uniform softmax.
Each model's ratio and native-op report is printed (pytest -s shows them).
"""
import keras
import numpy as np
import pytest
import tensorflow as tf

from support import RNG
from tftrt_py import trt_convert as trt
from tftrt_py.converters.summary import conversion_ratio

VOCAB, SEQ, DIM = 100, 16, 32


def transformer_block():
    tokens = keras.Input((SEQ,), dtype="int32")
    x = keras.layers.Embedding(VOCAB, DIM)(tokens)
    x = keras.layers.LayerNormalization()(x + keras.layers.MultiHeadAttention(num_heads=4, key_dim=8)(x, x))
    ffn = keras.layers.Dense(DIM)(keras.layers.Dense(2 * DIM, activation="gelu")(x))
    return keras.Model(tokens, keras.layers.LayerNormalization()(x + ffn))


#: name -> (model factory, range of its float inputs: EfficientNet rescales [0, 255] itself, the others take
#: preprocessed [-1, 1] images)
MODELS = {
    "transformer_block": (transformer_block, None),
    "efficientnet_b0": (lambda: keras.applications.EfficientNetB0(weights=None, input_shape=(64, 64, 3),
                                                                   classifier_activation=None), (0.0, 255.0)),
    "densenet121": (lambda: keras.applications.DenseNet121(weights=None, input_shape=(64, 64, 3),
                                                            classifier_activation=None), (-1.0, 1.0)),
    "nasnet_mobile": (lambda: keras.applications.NASNetMobile(weights=None, input_shape=(64, 64, 3),
                                                              classifier_activation=None), (-1.0, 1.0)),
}


def random_input(spec, batch, value_range):
    shape = [batch] + spec.shape.as_list()[1:]
    if spec.dtype == tf.int32:
        return tf.constant(RNG.integers(0, VOCAB, size=shape).astype(np.int32))
    return tf.constant(RNG.uniform(*value_range, size=shape).astype(np.float32))


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(MODELS))
def test_model_converts_and_matches(name, tmp_path):
    keras.utils.set_random_seed(7)
    model_dir = str(tmp_path / name)
    build, value_range = MODELS[name]
    build().export(model_dir)
    converter = trt.TrtGraphConverterV2(input_saved_model_dir=model_dir)
    func = converter.convert()
    inside, total = conversion_ratio(converter._converted_graph_def)
    print(f"\n{name}: {100.0 * inside / total:.2f}% of ops in engines [{inside}/{total}]")
    print(converter._report.format())
    assert inside / total >= 0.9, converter._report.format()
    native = tf.saved_model.load(model_dir).signatures["serving_default"]
    (key, spec), = native.structured_input_signature[1].items()
    for batch in (2, 1):  # fresh inputs; batch 1 after 2 as served by engines built for 2 where they can
        x = random_input(spec, batch, value_range)
        want, got = native(**{key: x}), func(**{key: x})
        for out in want:
            w, g = want[out].numpy(), got[out].numpy()
            np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4)
            # untrained EfficientNet's logits are ~1e-6: also within 1e-4 of the output's own scale
            np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4 * np.abs(w).max())
    stats = trt.engine_op_stats()
    engines = [n.name for n in converter._converted_graph_def.node if n.op == "TRTEngineOp"]
    assert engines and all(stats[n]["fallback_total"] == 0 for n in engines), stats
