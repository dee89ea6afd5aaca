"""A model whose signature reads a lookup table (a vocabulary file's StaticHashTable, Keras's StringLookup) converts,
saves with the table tracked (its vocabulary copied as an asset) and serves as the original, frozen or not."""
import os

import keras
import numpy as np
import pytest
import tensorflow as tf

from tftrt_py import trt_convert as trt
from tftrt_py.converters import restore


class Vocabulary(tf.Module):
    def __init__(self, vocab_file):
        super().__init__()
        init = tf.lookup.TextFileInitializer(vocab_file, tf.string, tf.lookup.TextFileIndex.WHOLE_LINE, tf.int64,
                                             tf.lookup.TextFileIndex.LINE_NUMBER)
        self.table = tf.lookup.StaticHashTable(init, -1)
        self.w = tf.Variable(np.arange(12, dtype=np.float32).reshape(4, 3) / 5)

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string), tf.TensorSpec([None, 4], tf.float32)])
    def serve(self, words, x):
        ids = self.table.lookup(words)
        return {"ids": ids, "y": tf.nn.relu(tf.matmul(x, self.w)) + tf.cast(tf.reduce_sum(ids), tf.float32)}


def convert_and_save(src, out, freeze=True):
    converter = trt.TrtGraphConverterV2(input_saved_model_dir=src, use_dynamic_shape=True)
    converter.freeze = freeze
    converter.convert()
    converter.save(out)
    return tf.saved_model.load(out).signatures["serving_default"]


@pytest.mark.parametrize("freeze", [True, False])
def test_a_vocabulary_table_is_saved_with_the_converted_model(tmp_path, freeze):
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("a\nb\nc\n")
    module = Vocabulary(str(vocab))
    src = str(tmp_path / "m")
    tf.saved_model.save(module, src, signatures={"serving_default": module.serve})
    os.remove(vocab)  # only the SavedModel's copy remains
    loaded = restore.load_for_signature(src, ["serve"], "serving_default")
    assert list(restore.captured_resources(loaded, loaded.signatures["serving_default"]).values()) == [loaded.table]
    served = convert_and_save(src, str(tmp_path / f"out_{freeze}"), freeze)
    words, x = tf.constant(["b", "zz", "c", "a"]), tf.constant(np.random.default_rng(0).standard_normal((3, 4)),
                                                                 tf.float32)
    got, want = served(words=words, x=x), module.serve(words, x)
    np.testing.assert_array_equal(got["ids"].numpy(), [1, -1, 2, 0])
    np.testing.assert_allclose(got["y"].numpy(), want["y"].numpy(), rtol=1e-6)


def test_a_keras_string_lookup_model_converts_whole_and_serves_as_keras(tmp_path):
    words = keras.Input((1,), dtype="string", name="words")
    numbers = keras.Input((4,), name="numbers")
    ids = keras.layers.StringLookup(vocabulary=["x", "y", "z"])(words)
    model = keras.Model([words, numbers], [ids, keras.layers.Dense(2)(numbers)])
    src = str(tmp_path / "k")
    model.export(src, verbose=False)
    served = convert_and_save(src, str(tmp_path / "out"))
    text = np.array([["y"], ["q"], ["z"]])
    x = np.random.default_rng(1).standard_normal((3, 4)).astype(np.float32)
    got = served(words=tf.constant(text), numbers=tf.constant(x))
    want = model([text, x])
    np.testing.assert_array_equal(got["output_0"].numpy(), np.asarray(want[0]))
    np.testing.assert_allclose(got["output_1"].numpy(), np.asarray(want[1]), rtol=1e-5, atol=1e-6)
