"""precision_mode="FP8" (our extension) through the converter: calibration as INT8 calibrates (the table in
calibration_data), quantization ops' ranges without calibration, engines served on the numpy backend against
native TensorFlow, and the command line."""
import numpy as np
import tensorflow as tf

from tftrt_py import trt_convert as trt
from tftrt_py.engine_op import dispatcher
from tftrt_py.tools.cli_convert import build_parser

RNG = np.random.default_rng(808)
CALIBRATION = [RNG.standard_normal((8, 32, 32, 3)).astype("float32") for _ in range(3)]
KERNEL = RNG.standard_normal((16, 8)).astype("float32") * 0.5


def engine_of(graph_def):
    (node,) = [n for n in graph_def.node if n.op == "TRTEngineOp"]
    (engine,) = dispatcher.find(node.attr["segment_key"].s.decode()).engines()
    return node, engine


def rel_l2(got, want):
    return float(np.linalg.norm(got - want) / np.linalg.norm(want))


def test_fp8_calibrates_like_int8_by_max_value_unless_told_and_serves_near_tensorflow(saved_model):
    path = saved_model("small_cnn")
    params = trt.DEFAULT_TRT_CONVERSION_PARAMS._replace(precision_mode="FP8")
    converter = trt.TrtGraphConverterV2(input_saved_model_dir=path, conversion_params=params)
    func = converter.convert(calibration_input_fn=lambda: ((x,) for x in CALIBRATION))
    node, engine = engine_of(converter._converted_graph_def)
    assert node.attr["precision_mode"].s == b"FP8"
    assert node.attr["calibration_data"].s.startswith(b"TRT-tftrt_py-MinMaxCalibration\nTensorRTInputPH_0: ")
    kinds = {(layer.kind, layer.precision) for layer in engine.network.layers}
    assert ("Convolution", "FP8") in kinds and engine.precision == "FP8"
    native = tf.saved_model.load(path).signatures["serving_default"]
    for _ in range(2):
        x = tf.constant(RNG.standard_normal((8, 32, 32, 3)).astype("float32"))
        got, want = func(image=x)["output_0"].numpy(), native(image=x)["output_0"].numpy()
        assert np.isfinite(got).all() and rel_l2(got, want) < 2e-2, rel_l2(got, want)


class QdqDense(tf.Module):
    """x -> QDQ [-1, 1] -> matmul -> bias -> relu -> QDQ [-3, 3]."""

    @tf.function(input_signature=[tf.TensorSpec([None, 16], tf.float32, name="x")])
    def serve(self, x):
        x = tf.quantization.quantize_and_dequantize_v2(x, -1.0, 1.0)
        y = tf.nn.relu(tf.matmul(x, KERNEL) + 0.1)
        return {"y": tf.quantization.quantize_and_dequantize_v2(y, -3.0, 3.0)}


def test_fp8_takes_the_ranges_of_quantization_ops_without_calibration(tmp_path):
    path = str(tmp_path / "qdq")
    module = QdqDense()
    tf.saved_model.save(module, path, signatures={"serving_default": module.serve})
    params = trt.DEFAULT_TRT_CONVERSION_PARAMS._replace(precision_mode="FP8", use_calibration=False)
    converter = trt.TrtGraphConverterV2(input_saved_model_dir=path, conversion_params=params)
    func = converter.convert()
    x = RNG.uniform(-1, 1, (8, 16)).astype("float32")
    converter.build(lambda: iter([(x,)]))
    _, engine = engine_of(converter._converted_graph_def)
    (mm,) = [layer for layer in engine.network.layers if layer.kind == "MatrixMultiply"]
    assert mm.precision == "FP8" and mm.inputs[0].dynamic_range == 1.0
    x = RNG.uniform(-1, 1, (8, 16)).astype("float32")
    native = tf.saved_model.load(path).signatures["serving_default"]
    got, want = func(x=tf.constant(x))["y"].numpy(), native(x=tf.constant(x))["y"].numpy()
    # TF's QDQ ops quantize to int8 steps, the engine to E4M3: both near the unquantized product
    exact = np.maximum(np.clip(x, -1, 1) @ KERNEL + 0.1, 0)
    assert rel_l2(got, exact) < 5e-2 and rel_l2(want, exact) < 5e-2


def test_cli_convert_accepts_fp8():
    args = build_parser().parse_args(["--input-dir", "a", "--output-dir", "b", "--precision-mode", "fp8"])
    assert args.precision_mode == "FP8"


def test_fp8_is_a_supported_precision_mode_and_calibrates():
    assert "FP8" in trt.TrtPrecisionMode.supported_precision_modes() and trt.TrtPrecisionMode.FP8 == "FP8"
    converter = trt.TrtGraphConverterV2(input_saved_model_dir="unused", conversion_params=trt.
                                        DEFAULT_TRT_CONVERSION_PARAMS._replace(precision_mode="fp8"))
    assert converter._need_calibration
