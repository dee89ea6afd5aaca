"""The user guide's TF 2.0 SavedModel example (section 2.2.4) with only the import line changed."""
import numpy as np
import tensorflow as tf
from tensorflow.python.framework import convert_to_constants
from tensorflow.python.saved_model import signature_constants, tag_constants

from tftrt_py import trt_convert as trt  # the only change: was tensorflow.python.compiler.tensorrt


class TwoInputModel(tf.Module):
    """A network with two image inputs, as in the guide's my_input_fn."""

    def __init__(self):
        rng = np.random.default_rng(3)
        self.k = tf.Variable(rng.normal(0, 0.3, (3, 3, 3, 8)).astype("float32"))
        self.b = tf.Variable(rng.normal(0, 0.1, (8,)).astype("float32"))

    @tf.function(input_signature=[tf.TensorSpec([None, 16, 16, 3], tf.float32, name="inp1"),
                                  tf.TensorSpec([None, 16, 16, 3], tf.float32, name="inp2")])
    def serve(self, inp1, inp2):
        x = tf.nn.relu(tf.nn.bias_add(tf.nn.conv2d(inp1 + inp2, self.k, 1, "SAME"), self.b))
        return tf.reduce_mean(x, axis=[1, 2])


def test_tf2_workflow_with_a_saved_model(tmp_path):
    input_saved_model_dir, output_saved_model_dir = str(tmp_path / "in"), str(tmp_path / "out")
    module = TwoInputModel()
    tf.saved_model.save(module, input_saved_model_dir, signatures={"serving_default": module.serve})

    # --- the guide's code, verbatim but for the import above ---
    conversion_params = trt.DEFAULT_TRT_CONVERSION_PARAMS
    conversion_params = conversion_params._replace(
        max_workspace_size_bytes=(1 << 32))
    conversion_params = conversion_params._replace(precision_mode="FP16")
    conversion_params = conversion_params._replace(
        maximum_cached_engines=100)
    converter = trt.TrtGraphConverterV2(
        input_saved_model_dir=input_saved_model_dir,
        conversion_params=conversion_params)
    converter.convert()

    def my_input_fn():
        # Input for a single inference call, for a network that has two input tensors:
        inp1 = np.random.normal(size=(8, 16, 16, 3)).astype(np.float32)
        inp2 = np.random.normal(size=(8, 16, 16, 3)).astype(np.float32)
        yield (inp1, inp2)
    converter.build(input_fn=my_input_fn)
    converter.save(output_saved_model_dir)

    saved_model_loaded = tf.saved_model.load(
        output_saved_model_dir, tags=[tag_constants.SERVING])
    graph_func = saved_model_loaded.signatures[
        signature_constants.DEFAULT_SERVING_SIGNATURE_DEF_KEY]
    frozen_func = convert_to_constants.convert_variables_to_constants_v2(
        graph_func)
    inp1 = np.random.normal(size=(8, 16, 16, 3)).astype(np.float32)
    inp2 = np.random.normal(size=(8, 16, 16, 3)).astype(np.float32)
    output = frozen_func(tf.constant(inp1), tf.constant(inp2))[0].numpy()
    # --- end of the guide's code ---

    want = module.serve(inp1, inp2).numpy()
    np.testing.assert_allclose(output, want, rtol=1e-2, atol=1e-2)  # FP16 tolerance
    graph_def = frozen_func.graph.as_graph_def()
    nodes = list(graph_def.node) + [n for f in graph_def.library.function for n in f.node_def]
    [name] = [n.name.split("/")[-1] for n in nodes if n.op == "TRTEngineOp"]
    stats = trt.engine_op_stats()[name]  # the loaded model's op: its engine came from the SavedModel's assets
    assert stats["builds"] == 0 and stats["hits"] >= 1 and stats["fallback_total"] == 0
