"""INT8 calibration end to end: TrtGraphConverterV2.convert(calibration_input_fn), TrtGraphConverter.calibrate(),
calibration tables in calibration_data through save and load, graph ranges mixed with calibrated ones, and
FP16 / INT8 engines against TensorFlow on small graphs."""
import threading

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.protobuf import saved_model_pb2

from support import frozen_graph_def, random_array, segment_graph_def
from tftrt_py import trt_convert as trt
from tftrt_py.calibration import CalibrationTable, Collector
from tftrt_py.convert import build as build_lib
from tftrt_py.convert.build import SegmentGraph, build_engine, calibration_engine
from tftrt_py.engine import BuilderConfig, backends
from tftrt_py.engine.backends.numpy_backend import NumpyBackend
from tftrt_py.engine.types import FLOATS
from tftrt_py.engine_op import dispatcher

RNG = np.random.default_rng(21)
CALIBRATION = [RNG.standard_normal((8, 32, 32, 3)).astype("float32") for _ in range(3)]


def calibrated(path, algorithm="entropy", batches=CALIBRATION):
    params = trt.DEFAULT_TRT_CONVERSION_PARAMS._replace(precision_mode="INT8", calibration_algorithm=algorithm)
    converter = trt.TrtGraphConverterV2(input_saved_model_dir=path, conversion_params=params)
    func = converter.convert(calibration_input_fn=lambda: ((x,) for x in batches))
    return converter, func


def engine_node(graph_def):
    (node,) = [n for n in graph_def.node if n.op == "TRTEngineOp"]
    return node


def engine_op(converter):
    return dispatcher.find(engine_node(converter._converted_graph_def).attr["segment_key"].s.decode())


def native(path):
    return tf.saved_model.load(path).signatures["serving_default"]


def test_convert_calibrates_writes_the_table_and_builds_the_int8_engine(small_cnn):
    converter, func = calibrated(small_cnn)
    table = engine_node(converter._converted_graph_def).attr["calibration_data"].s
    assert table.startswith(b"TRT-tftrt_py-EntropyCalibration2\nTensorRTInputPH_0: ")
    (node,) = [n for n in func.graph.as_graph_def().node if n.op == "TRTEngineOp"]
    assert node.attr["calibration_data"].s == table  # the function was rebuilt from the calibrated graph
    op = engine_op(converter)
    assert op.stats.builds == 1 and op.calibration.collector is None
    (engine,) = op.engines()  # the INT8 engine for the calibration shape, built by convert()
    kinds = {(layer.kind, layer.precision) for layer in engine.network.layers}
    assert ("Convolution", "INT8") in kinds and ("Softmax", "FP32") in kinds
    x = RNG.standard_normal((8, 32, 32, 3)).astype("float32")
    got = func(image=tf.constant(x))["output_0"].numpy()
    np.testing.assert_allclose(got, native(small_cnn)(image=tf.constant(x))["output_0"].numpy(), rtol=1e-1,
                               atol=1e-1)
    assert op.stats.engine_runs == 1 and op.stats.builds == 1


@pytest.mark.parametrize("algorithm, header", [("minmax", "MinMaxCalibration"),
                                               ("percentile", "PercentileCalibration")])
def test_the_calibration_algorithm_is_a_conversion_param(small_cnn, algorithm, header):
    converter, _ = calibrated(small_cnn, algorithm)
    table = CalibrationTable.from_bytes(engine_node(converter._converted_graph_def).attr["calibration_data"].s)
    assert table.calibrator == header
    amax = max(np.abs(x).max() for x in CALIBRATION)
    if algorithm == "minmax":
        assert table.ranges["TensorRTInputPH_0"] == pytest.approx(amax, rel=1e-6)
    else:
        assert table.ranges["TensorRTInputPH_0"] < amax


def test_unknown_calibration_algorithm_is_refused():
    with pytest.raises(ValueError, match="calibration_algorithm should be one of entropy, minmax, percentile"):
        trt.TrtGraphConverterV2(input_saved_model_dir="unused", conversion_params=trt.DEFAULT_TRT_CONVERSION_PARAMS
                                ._replace(calibration_algorithm="kl"))


def saved_engine_nodes(path):
    saved_model = saved_model_pb2.SavedModel()
    with open(f"{path}/saved_model.pb", "rb") as f:
        saved_model.ParseFromString(f.read())
    graph = saved_model.meta_graphs[0].graph_def
    return [n for f in graph.library.function for n in f.node_def if n.op == "TRTEngineOp"]


def test_the_table_survives_save_and_load_and_serves_new_shapes_without_recalibrating(small_cnn, tmp_path,
                                                                                       monkeypatch):
    converter, _ = calibrated(small_cnn)
    table = engine_node(converter._converted_graph_def).attr["calibration_data"].s
    converter.save(str(tmp_path / "int8"))
    assert [n.attr["calibration_data"].s for n in saved_engine_nodes(tmp_path / "int8")] == [table]

    monkeypatch.setattr(dispatcher, "_OPS", {})  # as in a fresh process: the loaded model makes its own op
    loaded = tf.saved_model.load(str(tmp_path / "int8")).signatures["serving_default"]
    for x in (CALIBRATION[0], random_array((16, 32, 32, 3))):  # the saved engine, then a new shape
        got = loaded(image=tf.constant(x))["output_0"].numpy()
        np.testing.assert_allclose(got, native(small_cnn)(image=tf.constant(x))["output_0"].numpy(), rtol=1e-1,
                                   atol=1e-1)
    (op,) = dispatcher._OPS.values()
    assert op.calibration.table == table and op.calibration.collector is None
    assert op.stats.builds == 1 and op.stats.engine_runs == 2 and op.stats.fallbacks == {}
    assert {layer.precision for e in op.engines() for layer in e.network.layers
            if layer.kind == "Convolution"} == {"INT8"}


class InputRange(tf.Module):
    """A range for the input in the graph (a bit wider than the data), none elsewhere: calibration gives the
    rest."""

    def __init__(self):
        rng = np.random.default_rng(3)
        self.k1 = tf.constant(rng.standard_normal((3, 3, 3, 8)).astype("float32") * 0.3)
        self.k2 = tf.constant(rng.standard_normal((3, 3, 8, 4)).astype("float32") * 0.3)

    @tf.function(input_signature=[tf.TensorSpec([None, 32, 32, 3], tf.float32, name="image")])
    def serve(self, image):
        x = tf.quantization.fake_quant_with_min_max_args(image, -6.0, 6.0)
        x = tf.nn.relu(tf.nn.conv2d(x, self.k1, 1, "SAME"))
        return {"y": tf.nn.conv2d(x, self.k2, 1, "SAME")}


def test_graph_ranges_win_and_calibration_gives_the_rest(tmp_path):
    module = InputRange()
    path = str(tmp_path / "model")
    tf.saved_model.save(module, path, signatures={"serving_default": module.serve})
    converter, func = calibrated(path, "minmax")
    table = CalibrationTable.from_bytes(engine_node(converter._converted_graph_def).attr["calibration_data"].s)
    (engine,) = engine_op(converter).engines()
    first, second = [layer for layer in engine.network.layers if layer.kind == "Convolution"]
    assert (first.precision, second.precision) == ("INT8", "INT8")
    assert first.inputs[0].dynamic_range == 6.0  # the graph's, not the calibrated max
    assert table.ranges["TensorRTInputPH_0"] < 6.0
    relu = [name for name in table.ranges if name.endswith("Relu:0")]
    assert second.inputs[0].dynamic_range == table.ranges[relu[0]]
    x = CALIBRATION[1]
    got, want = func(image=tf.constant(x))["y"].numpy(), native(path)(image=tf.constant(x))["y"].numpy()
    assert np.linalg.norm(got - want) / np.linalg.norm(want) < 0.05


@pytest.mark.parametrize("precision, header", [("INT8", b"EntropyCalibration2"), ("FP8", b"MinMaxCalibration")])
def test_tf1_calibrate_fills_calibration_data_with_the_table_of_the_precisions_calibrator(precision, header):
    rng = np.random.default_rng(4)
    w1, w2 = (tf.constant(rng.standard_normal(s).astype("float32") * 0.3) for s in ((3, 3, 3, 8), (3, 3, 8, 4)))
    fn = lambda x: tf.identity(tf.nn.conv2d(tf.nn.relu(tf.nn.conv2d(x, w1, 1, "SAME")), w2, 1, "SAME"), name="y")
    graph_def, _, _ = frozen_graph_def(fn, [tf.TensorSpec([None, 16, 16, 3], tf.float32, name="x")])
    x = rng.standard_normal((4, 16, 16, 3)).astype("float32")
    with tf.Graph().as_default():
        converter = trt.TrtGraphConverter(input_graph_def=graph_def, nodes_denylist=["y"], precision_mode=precision)
        converter.convert()
        trt_graph = converter.calibrate(["y:0"], num_runs=2, feed_dict_fn=lambda: {"x:0": x})
    (node,) = [n for n in trt_graph.node if n.op == "TRTEngineOp"]
    assert node.attr["calibration_data"].s.startswith(b"TRT-tftrt_py-" + header + b"\n")
    op = dispatcher.find(node.attr["segment_key"].s.decode())
    assert op.calibration_table() == node.attr["calibration_data"].s
    with tf.Graph().as_default():
        tf.graph_util.import_graph_def(trt_graph, name="")
        with tf.compat.v1.Session() as sess:
            got = sess.run("y:0", {"x:0": x})
    want = fn(tf.constant(x)).numpy()  # entropy clips the relu of this random net hard: compare as a whole
    assert np.linalg.norm(got - want) / np.linalg.norm(want) < 0.25
    assert [layer.precision for e in op.engines() for layer in e.network.layers] == [precision, precision]


# -- FP16 and INT8 engines against TensorFlow on small graphs (DESIGN: 1e-2 and 1e-1) --------------------
def _weights(*shape, scale=0.3, seed=0):
    return np.random.default_rng(seed + len(shape)).standard_normal(shape).astype("float32") * scale


SMALL_GRAPHS = {
    "mlp": ((6, 16), lambda x: tf.nn.softmax(tf.matmul(tf.nn.relu(tf.matmul(x, _weights(16, 32)) + 0.1),
                                                        _weights(32, 10)))),
    "conv": ((2, 12, 12, 3), lambda x: tf.nn.max_pool2d(tf.nn.relu(tf.nn.conv2d(x, _weights(3, 3, 3, 8), 1, "SAME")),
                                                        2, 2, "VALID")),
    "depthwise": ((2, 10, 10, 4), lambda x: tf.nn.relu6(tf.nn.depthwise_conv2d(
        x, _weights(3, 3, 4, 1), [1, 1, 1, 1], "SAME"))),
    "residual": ((2, 8, 8, 4), lambda x: tf.nn.relu(tf.nn.conv2d(tf.nn.relu(tf.nn.conv2d(x, _weights(3, 3, 4, 4), 1,
                                                                                         "SAME")),
                                                                 _weights(1, 1, 4, 4, seed=1), 1, "SAME") + x)),
    "batched_matmul": ((2, 5, 8), lambda x: tf.matmul(x, x, transpose_b=True) * 0.1),
    "layer_norm": ((4, 32), lambda x: tf.keras.ops.tanh(
        (x - tf.reduce_mean(x, -1, keepdims=True)) * tf.math.rsqrt(tf.math.reduce_variance(x, -1, keepdims=True)
                                                                    + 1e-3))),
}


#: what runs in int8 in each INT8 engine (chained matrix multiplies joined by a calibrated tensor: no MLP fusion)
INT8_KINDS = {"mlp": {"MatrixMultiply"}, "conv": {"Convolution"}, "depthwise": {"Convolution"},
              "residual": {"Convolution"}, "batched_matmul": {"MatrixMultiply"}, "layer_norm": set()}


@pytest.mark.parametrize("name", sorted(SMALL_GRAPHS))
@pytest.mark.parametrize("precision, tolerance", [("FP16", 1e-2), ("INT8", 1e-1)])
def test_reduced_precision_engines_match_tensorflow(name, precision, tolerance):
    """Element by element, so INT8 calibrates with minmax (entropy clips outliers by design)."""
    shape, fn = SMALL_GRAPHS[name]
    segment = SegmentGraph.from_graph_def(segment_graph_def(fn, [tf.TensorSpec(shape, tf.float32)]))
    ranges = None
    if precision == "INT8":
        collector, recorder = Collector("minmax"), calibration_engine(segment, [shape])
        for _ in range(4):
            recorder.execute([random_array(shape)], collector)
        ranges = CalibrationTable.from_bytes(collector.table().to_bytes()).ranges
    engine = build_engine(segment, [shape], config=BuilderConfig(precision=precision), ranges=ranges)
    if precision == "INT8":
        assert {layer.kind for layer in engine.network.layers if layer.precision == "INT8"} == INT8_KINDS[name]
    x = random_array(shape)
    got = engine.create_execution_context().execute_v2([x])[0]
    np.testing.assert_allclose(got, fn(tf.constant(x)).numpy(), rtol=tolerance, atol=tolerance)


class Anticipating(NumpyBackend):
    """A numpy backend that records what Builder.anticipate hands it."""

    anticipates = True

    def __init__(self):
        super().__init__()
        self.seen, self.done = [], threading.Event()

    def anticipate(self, network, precision, build_config):
        self.seen.append((network, precision, build_config))
        self.done.set()


def anticipating_backend(monkeypatch) -> Anticipating:
    backend = Anticipating()
    monkeypatch.setitem(backends._FACTORIES, "anticipating", Anticipating)
    monkeypatch.setitem(backends._INSTANCES, "anticipating", backend)
    return backend


def calibration_ranges(segment, x):
    """The min-max ranges of calibrating `segment` on the batch `x`."""
    collector, recorder = Collector("minmax"), calibration_engine(segment, [x.shape])
    recorder.execute([x], collector)
    return CalibrationTable.from_bytes(collector.table().to_bytes()).ranges


def test_calibrating_anticipates_the_int8_build_optimized_with_a_stand_in_range_on_every_float_tensor(monkeypatch):
    backend = anticipating_backend(monkeypatch)
    shape, fn = SMALL_GRAPHS["residual"]
    segment = SegmentGraph.from_graph_def(segment_graph_def(fn, [tf.TensorSpec(shape, tf.float32)]))
    config = BuilderConfig(precision="INT8", backend="anticipating")
    calibration_engine(segment, [shape], name="anticipated", config=config)
    assert backend.done.wait(60)
    ((network, precision, recorded),) = backend.seen
    assert precision == "INT8" and recorded == config.recorded()
    floats = [t for t in network.inputs + [o for layer in network.layers for o in layer.outputs]
              if t.dtype in FLOATS]
    assert floats and all(t.dynamic_range is not None for t in floats)
    assert {layer.kind for layer in network.layers if layer.precision == "INT8"} == {"Convolution"}
    # the build itself waits for the anticipation, then takes the calibrated ranges (of the batch it then serves:
    # a value beyond a range calibrated on other data would be clipped)
    x = random_array(shape)
    engine = build_engine(segment, [shape], name="anticipated", config=config, ranges=calibration_ranges(segment, x))
    assert not build_lib._ANTICIPATING
    np.testing.assert_allclose(engine.create_execution_context().execute_v2([x])[0], fn(tf.constant(x)).numpy(),
                               rtol=1e-1, atol=1e-1)


def test_a_backend_with_nothing_to_anticipate_gets_no_thread():
    shape, fn = SMALL_GRAPHS["conv"]
    segment = SegmentGraph.from_graph_def(segment_graph_def(fn, [tf.TensorSpec(shape, tf.float32)]))
    calibration_engine(segment, [shape], name="plain", config=BuilderConfig(precision="INT8"))
    assert not build_lib._ANTICIPATING
    assert not [t for t in threading.enumerate() if t.name.startswith("anticipate-")]
