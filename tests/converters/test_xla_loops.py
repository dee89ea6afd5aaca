"""With compile_native_loops, a loop whose trip count is known only when it runs becomes a call of a function XLA
compiles: the loop with the TensorList ops of a tf.map_fn around it, computing as TensorFlow does (at the built batch
and another, NaN included, after save and load). Loops XLA cannot compile, and every loop without the option, stay
TensorFlow's."""
import logging

import numpy as np
import pytest
import tensorflow as tf

from support import random_array, run_json_process
from tftrt_py import trt_convert as trt
from tftrt_py.converters.xla_loops import MUST_COMPILE_ATTR

FEATURES = 6


def halve_until_small(y):
    """A loop whose trip count depends on the values: halve y until every |y| <= 1."""
    return tf.while_loop(lambda v: tf.reduce_max(tf.abs(v)) > 1.0, lambda v: [v * 0.5], [y])[0]


class Halving(tf.Module):
    """Engine-sized work before and after a data-dependent loop over the whole batch."""

    def __init__(self):
        super().__init__()
        rng = np.random.default_rng(3)
        self.w1 = tf.constant(rng.standard_normal((FEATURES, 8)).astype("float32") * 4)
        self.w2 = tf.constant(rng.standard_normal((8, 3)).astype("float32"))

    @tf.function(input_signature=[tf.TensorSpec((None, FEATURES), tf.float32, name="x")])
    def serve(self, x):
        y = tf.nn.relu(tf.matmul(x, self.w1) + 1.0)
        y = halve_until_small(y)
        return {"out": tf.nn.relu(tf.matmul(y, self.w2) - 0.1)}


class PerRowHalving(Halving):
    """The loop on each row alone (tf.map_fn: TensorLists fill and stack around it), each row its own trip count."""

    @tf.function(input_signature=[tf.TensorSpec((None, FEATURES), tf.float32, name="x")])
    def serve(self, x):
        y = tf.nn.relu(tf.matmul(x, self.w1) + 1.0)
        y = tf.map_fn(halve_until_small, y)
        return {"out": tf.nn.relu(tf.matmul(y, self.w2) - 0.1)}


class StringsInLoop(Halving):
    """A loop whose body holds ops XLA has no kernel for (strings)."""

    @tf.function(input_signature=[tf.TensorSpec((None, FEATURES), tf.float32, name="x")])
    def serve(self, x):
        y = tf.nn.relu(tf.matmul(x, self.w1) + 1.0)

        def body(v, n):
            return [v * 0.5, n + tf.reduce_sum(tf.strings.length(tf.strings.as_string(tf.round(v))))]
        y, n = tf.while_loop(lambda v, n: tf.reduce_max(tf.abs(v)) > 1.0, body, [y, 0])
        return {"out": tf.nn.relu(tf.matmul(y, self.w2) - 0.1) + tf.cast(n, tf.float32)}


def export(module, path) -> str:
    tf.saved_model.save(module, str(path), signatures={"serving_default": module.serve})
    return str(path)


def convert(src, compile_native_loops=True, batch=4):
    converter = trt.TrtGraphConverterV2(input_saved_model_dir=src, minimum_segment_size=2,
                                        compile_native_loops=compile_native_loops)
    func = converter.convert()
    converter.build(input_fn=lambda: [tf.constant(random_array((batch, FEATURES)))])
    return converter, func


def compiled_calls(graph_def):
    return [n for n in graph_def.node if MUST_COMPILE_ATTR in n.attr and n.attr[MUST_COMPILE_ATTR].b]


def top_level_loops(graph_def):
    return [n.op for n in graph_def.node if n.op in ("While", "StatelessWhile")]


def assert_computes_as_native(func, native):
    inputs = [random_array((4, FEATURES), high=3.0), random_array((3, FEATURES), high=3.0)]
    with_nan = random_array((2, FEATURES))
    with_nan[1, 2] = np.nan
    for x in inputs + [with_nan]:
        got, want = func(x=tf.constant(x))["out"].numpy(), native(x=tf.constant(x))["out"].numpy()
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, equal_nan=True)


@pytest.mark.parametrize("module", [Halving, PerRowHalving], ids=["whole_batch", "map_fn_per_row"])
def test_a_data_dependent_loop_becomes_an_xla_call_computing_as_tensorflow(tmp_path, module):
    src = export(module(), tmp_path / "native")
    converter, func = convert(src)
    graph = converter._converted_graph_def
    calls = compiled_calls(graph)
    assert len(calls) == 1 and calls[0].op == "PartitionedCall" and not top_level_loops(graph)
    assert [n.op for n in graph.node].count("TRTEngineOp") == 2
    if module is PerRowHalving:  # the map_fn's TensorLists went into the compiled function with the loop
        assert not [n.op for n in graph.node if n.op.startswith("TensorList")]
    native = tf.saved_model.load(src).signatures["serving_default"]
    assert_computes_as_native(func, native)
    converter.save(str(tmp_path / "converted"))
    loaded = tf.saved_model.load(str(tmp_path / "converted")).signatures["serving_default"]
    assert_computes_as_native(loaded, native)


def test_the_summary_names_the_compiled_loops(tmp_path):
    converter, _ = convert(export(PerRowHalving(), tmp_path / "native"))
    lines = []
    converter.summary(print_fn=lines.append)
    compiled = [line for line in lines if line.startswith("[*] Native loops compiled by XLA")]
    assert len(compiled) == 1 and compiled[0].startswith("[*] Native loops compiled by XLA: 1 (XlaLoop_")


def test_a_loop_xla_cannot_compile_stays_tensorflows_and_says_why(tmp_path, caplog):
    src = export(StringsInLoop(), tmp_path / "native")
    with caplog.at_level(logging.INFO, logger="tftrt_py.converters.xla_loops"):
        converter, func = convert(src)
    graph = converter._converted_graph_def
    assert not compiled_calls(graph) and len(top_level_loops(graph)) == 1
    assert any("stays native: XLA does not compile it" in r.getMessage() for r in caplog.records)
    assert_computes_as_native(func, tf.saved_model.load(src).signatures["serving_default"])


@pytest.mark.slow
def test_a_keras_lstm_over_sequences_of_any_length_compiles_and_computes_as_keras(tmp_path):
    """Its loop cannot be unrolled (the length is known only when it runs); its kernel's weights are loop inputs, so
    the compiled function holds them, and it calls its own body and condition."""
    import keras

    keras.utils.set_random_seed(2)
    inputs = keras.Input((None, FEATURES), name="x")
    src = str(tmp_path / "native")
    keras.Model(inputs, keras.layers.Dense(3)(keras.layers.LSTM(7)(inputs))).export(src, verbose=False)
    converter = trt.TrtGraphConverterV2(input_saved_model_dir=src, compile_native_loops=True)
    func = converter.convert()
    converter.build(input_fn=lambda: [tf.constant(random_array((4, 6, FEATURES)))])
    graph = converter._converted_graph_def
    assert len(compiled_calls(graph)) == 1 and not top_level_loops(graph)
    converter.save(str(tmp_path / "converted"))
    loaded = tf.saved_model.load(str(tmp_path / "converted")).signatures["serving_default"]
    native = tf.saved_model.load(src).signatures["serving_default"]
    for shape in ((4, 6, FEATURES), (4, 11, FEATURES), (2, 3, FEATURES)):
        x = tf.constant(random_array(shape))
        want = native(x=x)
        for served in (func, loaded):
            got = served(x=x)
            for key in want:
                np.testing.assert_allclose(got[key].numpy(), want[key].numpy(), rtol=1e-5, atol=1e-6)


NAN_IGNORED = """
import json, logging, sys
sys.path[:0] = ["tests", "tests/converters"]
logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
from test_xla_loops import Halving, compiled_calls, convert, export
path = json.load(sys.stdin)["path"]
converter, _ = convert(export(Halving(), path))
print(json.dumps({"compiled": len(compiled_calls(converter._converted_graph_def))}))
"""


def test_where_xla_ignores_nan_in_max_and_min_loops_stay_tensorflows(tmp_path):
    """A process whose XLA_FLAGS ask for XLA's fast Max and Min (which drop NaN) keeps them: loops stay native."""
    result = run_json_process(NAN_IGNORED, {"path": str(tmp_path / "native")},
                              XLA_FLAGS="--xla_cpu_enable_fast_min_max=true")
    assert result == {"compiled": 0}


def test_without_the_option_loops_stay_tensorflows(tmp_path):
    converter, _ = convert(export(Halving(), tmp_path / "native"), compile_native_loops=False)
    graph = converter._converted_graph_def
    assert not compiled_calls(graph) and top_level_loops(graph)


@pytest.mark.slow
def test_keras_hub_retinanets_nms_loops_compile_and_detect_as_tensorflow(tmp_path):
    """The zoo's RetinaNet, its decoding exported per image (a tf.map_fn over keras-hub's NMS, whose tile loops
    nest in the map's): the map's loop and its lists become one compiled call; the detections at the built batch
    and at batch 1 (compiled when it first comes) are TensorFlow's, the engines' float error aside."""
    import keras

    from zoo import models as zoo

    keras.utils.set_random_seed(0)
    src = str(tmp_path / "native")
    zoo._export_detector(zoo._retinanet(), src)
    built = random_array((4,) + zoo.RETINANET_IMAGE)
    converter = trt.TrtGraphConverterV2(input_saved_model_dir=src, compile_native_loops=True)
    func = converter.convert()
    converter.build(input_fn=lambda: [tf.constant(built)])
    graph = converter._converted_graph_def
    assert len(compiled_calls(graph)) == 1 and not top_level_loops(graph)
    native = tf.saved_model.load(src).signatures["serving_default"]
    for images in (built, random_array((1,) + zoo.RETINANET_IMAGE)):
        got, want = func(images=tf.constant(images)), native(images=tf.constant(images))
        for key in ("labels", "num_detections"):
            np.testing.assert_array_equal(got[key].numpy(), want[key].numpy())
        for key in ("boxes", "confidence"):  # within 1e-5 of their scale, as the zoo holds decoded detections
            scale = np.abs(want[key].numpy()).max()
            assert np.abs(got[key].numpy() - want[key].numpy()).max() <= 1e-5 * scale, key
