"""Quantization ops give INT8 ranges (user guide 2.9.2): QuantizeAndDequantizeV2/V3/V4 and
FakeQuantWithMinMaxVars/Args set their input tensor's dynamic range in INT8 and stay native otherwise; a
range an int8 layer needs but nobody gave is an error naming the tensor (2.9.3.1)."""
import logging

import numpy as np
import pytest
import tensorflow as tf

from support import frozen_graph_def, random_array, segment_graph_def
from tftrt_py import trt_convert as trt
from tftrt_py.convert.build import SegmentGraph, build_engine, network_from_segment
from tftrt_py.convert.context import ValidationContext
from tftrt_py.convert.errors import MissingQuantizationRangeError
from tftrt_py.convert.graph import GraphView
from tftrt_py.convert.ops import get_converter
from tftrt_py.engine import BuilderConfig
from tftrt_py.engine_op import dispatcher
from tftrt_py.segmenter import segment_graph

RNG = np.random.default_rng(5)
KERNEL = RNG.standard_normal((16, 8)).astype("float32") * 0.5
BIAS = RNG.standard_normal(8).astype("float32")
CONV1 = RNG.standard_normal((3, 3, 2, 4)).astype("float32") * 0.3
CONV2 = RNG.standard_normal((3, 3, 4, 4)).astype("float32") * 0.3

QUANTIZERS = {
    "QuantizeAndDequantizeV2": lambda t: tf.raw_ops.QuantizeAndDequantizeV2(
        input=t, input_min=-1.5, input_max=2.5, range_given=True),
    "QuantizeAndDequantizeV3": lambda t: tf.raw_ops.QuantizeAndDequantizeV3(
        input=t, input_min=-1.5, input_max=2.5, num_bits=8, range_given=True),
    "QuantizeAndDequantizeV4": lambda t: tf.quantization.quantize_and_dequantize_v2(t, -1.5, 2.5),
    "FakeQuantWithMinMaxVars": lambda t: tf.quantization.fake_quant_with_min_max_vars(t, -1.5, 2.5),
    "FakeQuantWithMinMaxArgs": lambda t: tf.quantization.fake_quant_with_min_max_args(t, min=-1.5, max=2.5),
}


def reason(fn, specs, op, precision):
    view = GraphView(frozen_graph_def(fn, specs)[0])
    node = next(n for n in view.nodes.values() if n.op == op)
    return get_converter(op).check(node, ValidationContext(view, precision=precision))


def int8_network(fn, shapes):
    specs = [tf.TensorSpec(s, tf.float32) for s in shapes]
    return network_from_segment(SegmentGraph.from_graph_def(segment_graph_def(fn, specs)), shapes, precision="INT8")


@pytest.mark.parametrize("op", sorted(QUANTIZERS))
def test_int8_sets_the_symmetric_range_of_the_input_and_passes_it_through(op):
    fn = lambda x: QUANTIZERS[op](tf.nn.relu(x)) * 2.0
    net = int8_network(fn, [(2, 5)])
    relu = next(layer for layer in net.layers if layer.kind == "Activation")
    assert relu.outputs[0].dynamic_range == 2.5  # max(|-1.5|, |2.5|)
    assert not any(op in layer.name for layer in net.layers)  # no layer: the value passes through
    mul = next(layer for layer in net.layers if layer.kind == "ElementWise")
    assert mul.inputs[0] is relu.outputs[0]


@pytest.mark.parametrize("op", sorted(QUANTIZERS))
@pytest.mark.parametrize("precision", ["FP32", "FP16"])
def test_outside_int8_they_do_not_convert(op, precision):
    got = reason(QUANTIZERS[op], [tf.TensorSpec((2, 5), tf.float32)], op, precision)
    assert got == f"{op} only gives a quantization range; it converts with precision_mode 'INT8' or 'FP8'"
    assert reason(QUANTIZERS[op], [tf.TensorSpec((2, 5), tf.float32)], op, "INT8") is None


def test_outside_int8_they_split_the_graph():
    fn = lambda x: tf.nn.relu(tf.nn.relu(QUANTIZERS["QuantizeAndDequantizeV2"](tf.nn.relu(tf.nn.relu(x)))))
    graph_def, _, outputs = frozen_graph_def(fn, [tf.TensorSpec((2, 5), tf.float32)])
    fp32 = segment_graph(graph_def, minimum_segment_size=1, fetches=outputs)
    int8 = segment_graph(graph_def, minimum_segment_size=1, fetches=outputs, precision_mode="INT8")
    assert len(fp32.segments) == 2 and len(int8.segments) == 1
    assert "QuantizeAndDequantizeV2" in {op for op, _ in fp32.report.node_reasons.values()}


@pytest.mark.parametrize("fn, op, expected", [
    (lambda t: tf.quantization.fake_quant_with_min_max_args(t, -1.0, 1.0, num_bits=4), "FakeQuantWithMinMaxArgs",
     "FakeQuantWithMinMaxArgs with num_bits=4 is not supported (INT8 needs 8)"),
    (lambda t: tf.raw_ops.QuantizeAndDequantizeV3(input=t, input_min=-1.0, input_max=1.0, num_bits=6),
     "QuantizeAndDequantizeV3", "QuantizeAndDequantizeV3 with num_bits=6 is not supported (INT8 needs 8)"),
    (lambda t: tf.raw_ops.QuantizeAndDequantizeV2(input=t, input_min=[-1.0] * 5, input_max=[1.0] * 5, axis=1,
                                                  range_given=True), "QuantizeAndDequantizeV2",
     "QuantizeAndDequantizeV2 with axis=1: per-channel quantization ranges are not supported"),
    (lambda t: tf.quantization.fake_quant_with_min_max_vars(t, tf.reduce_min(t), tf.reduce_max(t)),
     "FakeQuantWithMinMaxVars", "input 1 of FakeQuantWithMinMaxVars must be a constant"),
])
def test_unsupported_forms_are_refused(fn, op, expected):
    assert reason(fn, [tf.TensorSpec((2, 5), tf.float32)], op, "INT8") == expected


def conv_chain(x, with_middle_range):
    """qdq -> conv -> relu (-> fake quant) -> conv: the second conv needs the relu's range."""
    x = tf.quantization.quantize_and_dequantize_v2(x, -3.0, 3.0)
    y = tf.nn.relu(tf.nn.conv2d(x, CONV1, 1, "SAME"), name="first_relu")
    if with_middle_range:
        y = tf.quantization.fake_quant_with_min_max_args(y, -4.0, 4.0)
    return tf.nn.conv2d(y, CONV2, 1, "SAME")


def test_a_missing_range_is_an_error_naming_the_tensor():
    specs = [tf.TensorSpec((2, 6, 6, 2), tf.float32)]
    segment = segment_graph_def(lambda x: conv_chain(x, False), specs)
    with pytest.raises(MissingQuantizationRangeError, match=r"no quantization range for tensor\(s\) first_relu:0") \
            as info:
        build_engine(segment, [(2, 6, 6, 2)], config=BuilderConfig(precision="INT8"))
    assert info.value.tensors == ["first_relu:0"] and info.value.code == "MISSING_QUANTIZATION_RANGE"
    segment = segment_graph_def(lambda x: conv_chain(x, True), specs)
    engine = build_engine(segment, [(2, 6, 6, 2)], config=BuilderConfig(precision="INT8"))
    assert [layer.precision for layer in engine.network.layers if layer.kind == "Convolution"] == ["INT8", "INT8"]


# -- TrtGraphConverterV2 with use_calibration=False (user guide 2.9.2) -----------------------------------
class SeedGraph(tf.Module):
    """The user guide's example (2.9.2): quantize_and_dequantize_v2 -> matmul -> qdq -> bias_add -> qdq."""

    @tf.function(input_signature=[tf.TensorSpec([None, 16], tf.float32, name="x")])
    def serve(self, x):
        x = tf.quantization.quantize_and_dequantize_v2(x, input_min=-1.0, input_max=1.0)
        x = tf.matmul(x, KERNEL)
        x = tf.quantization.quantize_and_dequantize_v2(x, input_min=-9.0, input_max=9.0)
        x = tf.nn.bias_add(x, BIAS)
        x = tf.quantization.quantize_and_dequantize_v2(x, input_min=-3.0, input_max=3.0)
        return {"y": x}


class ConvChain(tf.Module):
    def __init__(self, with_middle_range):
        self.with_middle_range = with_middle_range

    @tf.function(input_signature=[tf.TensorSpec([None, 6, 6, 2], tf.float32, name="x")])
    def serve(self, x):
        return {"y": conv_chain(x, self.with_middle_range)}


def saved(module, path):
    tf.saved_model.save(module, str(path), signatures={"serving_default": module.serve})
    return str(path)


def convert(path, precision="INT8", **kwargs):
    params = trt.DEFAULT_TRT_CONVERSION_PARAMS._replace(precision_mode=precision, use_calibration=False, **kwargs)
    converter = trt.TrtGraphConverterV2(input_saved_model_dir=path, conversion_params=params)
    return converter, converter.convert()


def engine_of(converter):
    (node,) = [n for n in converter._converted_graph_def.node if n.op == "TRTEngineOp"]
    (engine,) = dispatcher.find(node.attr["segment_key"].s.decode()).engines()
    return engine


def test_the_seed_example_converts_to_one_int8_engine(tmp_path):
    path = saved(SeedGraph(), tmp_path / "seed")
    converter, func = convert(path)
    x = RNG.uniform(-1, 1, (8, 16)).astype("float32")
    converter.build(lambda: iter([(x,)]))
    nodes = converter._converted_graph_def.node
    assert [n.op for n in nodes if n.op not in ("Placeholder", "Identity", "NoOp")] == ["TRTEngineOp"]
    engine = engine_of(converter)
    (mm,) = [layer for layer in engine.network.layers if layer.kind == "MatrixMultiply"]
    assert mm.precision == "INT8" and mm.inputs[0].dynamic_range == 1.0
    assert mm.outputs[0].dynamic_range == 3.0  # matmul + bias fused: the [-9, 9] range is ignored
    native = tf.saved_model.load(path).signatures["serving_default"]
    np.testing.assert_allclose(func(x=tf.constant(x))["y"].numpy(), native(x=tf.constant(x))["y"].numpy(),
                               rtol=1e-1, atol=1e-1)


def test_in_fp32_the_seed_example_keeps_its_quantization_ops_native(tmp_path):
    converter, _ = convert(saved(SeedGraph(), tmp_path / "seed"), precision="FP32")
    ops = [n.op for n in converter._converted_graph_def.node]
    assert ops.count("QuantizeAndDequantizeV4") == 3


def test_build_raises_listing_the_tensors_without_a_range(tmp_path, caplog):
    converter, func = convert(saved(ConvChain(False), tmp_path / "chain"))
    x = random_array((2, 6, 6, 2))
    with pytest.raises(MissingQuantizationRangeError, match=r"missing for TRTEngineOp_\d+_000: \S*first_relu:0\. "
                                                            r"Add QuantizeAndDequantizeV2/V3"):
        converter.build(lambda: iter([(x,)]))
    assert "runs its native segment" in caplog.text  # serving falls back (logged), build() says why
    converter, _ = convert(saved(ConvChain(True), tmp_path / "chain_ok"))
    converter.build(lambda: iter([(x,)]))
    assert {layer.precision for layer in engine_of(converter).network.layers if layer.kind == "Convolution"} == \
        {"INT8"}


class NoInputRange(tf.Module):
    """A range on the matmul's output only: the matmul's input (the engine's input) has none."""

    @tf.function(input_signature=[tf.TensorSpec([None, 16], tf.float32, name="x")])
    def serve(self, x):
        return {"y": tf.quantization.quantize_and_dequantize_v2(tf.nn.relu(tf.matmul(x, KERNEL)), -3.0, 3.0)}


def test_an_engine_input_without_a_range_is_named_by_the_graph_tensor_feeding_it(tmp_path):
    converter, _ = convert(saved(NoInputRange(), tmp_path / "no_input_range"))
    with pytest.raises(MissingQuantizationRangeError, match=r"missing for TRTEngineOp_\d+_000: x(:0)?\. ") as info:
        converter.build(lambda: iter([(random_array((4, 16)),)]))
    assert info.value.tensors in (["x"], ["x:0"])


def test_int8_without_calibration_or_ranges_builds_fp16_with_a_warning(tmp_path, saved_model, caplog):
    converter, func = convert(saved_model("small_cnn"))
    x = random_array((2, 32, 32, 3))
    with caplog.at_level(logging.WARNING):
        converter.build(lambda: iter([(x,)]))
    assert "no tensor has a dynamic range" in caplog.text
    assert {layer.precision for layer in engine_of(converter).network.layers} <= {"FP16", "FP32", None}
    native = tf.saved_model.load(saved_model("small_cnn")).signatures["serving_default"]
    np.testing.assert_allclose(func(image=tf.constant(x))["output_0"].numpy(),
                               native(image=tf.constant(x))["output_0"].numpy(), rtol=1e-2, atol=1e-2)
