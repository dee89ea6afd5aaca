"""Loops of a trip count known when converting are unrolled into their body's ops, which convert with the graph around
them: Keras RNN layers with a fixed sequence length become one engine computing as TensorFlow does (at the built batch
and another, NaN and Inf included) and a saved model serves its saved engine. Loops whose trip count is known only
when they run, that would run too often, or whose body holds a stateful op stay loops."""
import keras
import numpy as np
import pytest
import tensorflow as tf

from support import random_array
from tftrt_py import trt_convert as trt
from tftrt_py.converters import unroll
from tftrt_py.engine_op import dispatcher

SEQ, FEATURES = 6, 5


def ops_of(graph_def):
    return [n.op for n in graph_def.node]


def loops_in(graph_def):
    return [op for op in ops_of(graph_def) if op in ("While", "StatelessWhile")]


def convert(src, batch=None, feed=None):
    converter = trt.TrtGraphConverterV2(input_saved_model_dir=src)
    func = converter.convert()
    if feed is not None:
        converter.build(input_fn=lambda: [feed])
    return converter, func


def export(model, path):
    model.export(str(path), verbose=False)
    return str(path)


def rnn_model(layer, seq=SEQ):
    inputs = keras.Input((seq, FEATURES), name="x")
    return keras.Model(inputs, layer(inputs))


RNN_LAYERS = {
    "lstm": lambda: keras.layers.LSTM(7),
    "lstm_sequences_and_states": lambda: keras.layers.LSTM(7, return_sequences=True, return_state=True),
    "gru_sequences": lambda: keras.layers.GRU(4, return_sequences=True),
    "simple_rnn_backwards": lambda: keras.layers.SimpleRNN(3, go_backwards=True),
}


@pytest.mark.parametrize("name", sorted(RNN_LAYERS))
def test_a_keras_rnn_with_a_fixed_length_becomes_one_engine_computing_as_keras(tmp_path, name):
    keras.utils.set_random_seed(1)
    model = rnn_model(RNN_LAYERS[name]())
    src = export(model, tmp_path / name)
    built = random_array((4, SEQ, FEATURES))
    converter, func = convert(src, feed=tf.constant(built))
    graph = converter._converted_graph_def
    assert not loops_in(graph)
    assert ops_of(graph).count("TRTEngineOp") == 1
    native = tf.saved_model.load(src).signatures["serving_default"]
    for x in (built, random_array((3, SEQ, FEATURES))):  # the built batch and another
        got, want = func(x=tf.constant(x)), native(x=tf.constant(x))
        for key in want:
            np.testing.assert_allclose(got[key].numpy(), want[key].numpy(), rtol=1e-5, atol=1e-6)


def test_stacked_rnns_over_masked_token_ids_become_one_engine_computing_as_keras(tmp_path):
    """Embedding(mask_zero) -> LSTM(return_sequences) -> GRU(reset_after=False): each step's mask is a slice of the
    unstacked mask, as its inputs are."""
    keras.utils.set_random_seed(5)
    ids = keras.Input((SEQ,), dtype="int32", name="ids")
    x = keras.layers.Embedding(20, 6, mask_zero=True)(ids)
    x = keras.layers.GRU(4, reset_after=False)(keras.layers.LSTM(5, return_sequences=True)(x))
    src = export(keras.Model(ids, keras.layers.Dense(3)(x)), tmp_path / "masked")
    tokens = np.random.default_rng(0).integers(1, 20, (4, SEQ)).astype("int32")
    tokens[:, -2:], tokens[1, :3] = 0, 0  # padding at the end, and inside one row
    converter, func = convert(src, feed=tf.constant(tokens))
    assert not loops_in(converter._converted_graph_def)
    assert ops_of(converter._converted_graph_def).count("TRTEngineOp") == 1
    want = tf.saved_model.load(src).signatures["serving_default"](ids=tf.constant(tokens))["output_0"].numpy()
    np.testing.assert_allclose(func(ids=tf.constant(tokens))["output_0"].numpy(), want, rtol=1e-5, atol=1e-6)


def test_nan_and_inf_inputs_reach_the_outputs_as_in_tensorflow(tmp_path):
    keras.utils.set_random_seed(2)
    src = export(rnn_model(keras.layers.GRU(4, return_sequences=True)), tmp_path / "gru")
    x = random_array((2, SEQ, FEATURES))
    x[0, 1, 2], x[1, 3, 0] = np.nan, np.inf
    _, func = convert(src, feed=tf.constant(x))
    got = func(x=tf.constant(x))["output_0"].numpy()
    want = tf.saved_model.load(src).signatures["serving_default"](x=tf.constant(x))["output_0"].numpy()
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    assert np.isnan(got).any()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_a_saved_unrolled_model_serves_its_saved_engine_without_building(tmp_path):
    keras.utils.set_random_seed(3)
    src = export(rnn_model(keras.layers.LSTM(6)), tmp_path / "lstm")
    x = random_array((2, SEQ, FEATURES))
    converter, _ = convert(src, feed=tf.constant(x))
    converter.save(str(tmp_path / "out"))
    del converter
    before = set(dispatcher.engine_ops())
    served = tf.saved_model.load(str(tmp_path / "out")).signatures["serving_default"]
    got = served(x=tf.constant(x))["output_0"].numpy()
    want = tf.saved_model.load(src).signatures["serving_default"](x=tf.constant(x))["output_0"].numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    loaded = [op for key, op in dispatcher.engine_ops().items() if key not in before]
    assert len(loaded) == 1 and loaded[0].stats.engine_runs == 1 and loaded[0].stats.builds == 0


def test_an_rnn_over_sequences_of_any_length_stays_a_loop(tmp_path):
    keras.utils.set_random_seed(4)
    src = export(rnn_model(keras.layers.LSTM(3), seq=None), tmp_path / "any_length")
    converter, func = convert(src)
    assert loops_in(converter._converted_graph_def)
    x = random_array((2, 9, FEATURES))
    want = tf.saved_model.load(src).signatures["serving_default"](x=tf.constant(x))["output_0"]
    np.testing.assert_allclose(func(x=tf.constant(x))["output_0"].numpy(), want.numpy(), rtol=1e-5, atol=1e-6)


class Loops(tf.Module):
    @tf.function(input_signature=[tf.TensorSpec([None, 4], tf.float32)])
    def until_large(self, x):
        """Runs until the values pass a bound: how often depends on the input."""
        return tf.while_loop(lambda v: tf.reduce_max(v) < 50.0, lambda v: v * 2.0 + 1.0, [tf.abs(x) + 1.0])[0]

    @tf.function(input_signature=[tf.TensorSpec([None, 4], tf.float32)])
    def eight_steps(self, x):
        return tf.while_loop(lambda i, v: i < 8, lambda i, v: (i + 1, tf.tanh(v * 1.5) + v), [0, x])[1]

    @tf.function(input_signature=[tf.TensorSpec([None, 4], tf.float32)])
    def noisy(self, x):
        """A stateful op in the body: each copy would draw other numbers than the loop's iterations."""
        return tf.while_loop(lambda i, v: i < 3, lambda i, v: (i + 1, v + tf.random.stateless_uniform(
            [4], [1, 2]) + tf.random.uniform([4], seed=1)), [0, x])[1]


@pytest.fixture(scope="module")
def loops(tmp_path_factory):
    module = Loops()
    src = str(tmp_path_factory.mktemp("loops") / "m")
    tf.saved_model.save(module, src, signatures={"until_large": module.until_large, "eight_steps": module.eight_steps,
                                                 "noisy": module.noisy})
    return module, src


def convert_signature(src, key):
    converter = trt.TrtGraphConverterV2(input_saved_model_dir=src, input_saved_model_signature_key=key)
    return converter, converter.convert()


def test_a_loop_whose_condition_reads_the_data_stays_a_loop(loops):
    module, src = loops
    converter, func = convert_signature(src, "until_large")
    assert loops_in(converter._converted_graph_def)
    x = random_array((3, 4))
    np.testing.assert_allclose(func(x=tf.constant(x))["output_0"].numpy(), module.until_large(x).numpy(), rtol=1e-6)


def test_a_counted_loop_is_unrolled_and_computes_as_the_loop(loops):
    module, src = loops
    converter, func = convert_signature(src, "eight_steps")
    assert not loops_in(converter._converted_graph_def)
    x = random_array((3, 4))
    np.testing.assert_allclose(func(x=tf.constant(x))["output_0"].numpy(), module.eight_steps(x).numpy(),
                               rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("bound, stays", [(7, True), (8, False)])
def test_a_loop_running_more_often_than_the_bound_stays_a_loop(loops, monkeypatch, bound, stays):
    module, src = loops
    monkeypatch.setattr(unroll, "MAX_ITERATIONS", bound)
    converter, func = convert_signature(src, "eight_steps")
    assert bool(loops_in(converter._converted_graph_def)) == stays
    x = random_array((3, 4))
    np.testing.assert_allclose(func(x=tf.constant(x))["output_0"].numpy(), module.eight_steps(x).numpy(),
                               rtol=1e-5, atol=1e-6)


def test_a_loop_with_a_stateful_op_in_its_body_stays_a_loop(loops):
    _, src = loops
    converter, _ = convert_signature(src, "noisy")
    assert loops_in(converter._converted_graph_def)
