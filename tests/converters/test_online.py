"""Online conversion (TF1 sessions): get_tensorrt_rewriter_config as TF-TRT builds it, and the session graph
converted by the TensorRTOptimizer pass it names."""
import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.protobuf import rewriter_config_pb2

from support import random_array
from tftrt_py import trt_convert as trt
from tftrt_py.engine_op import dispatcher

RC = rewriter_config_pb2.RewriterConfig


def params(**kwargs):
    return trt.DEFAULT_TRT_CONVERSION_PARAMS._replace(**kwargs)


def test_the_rewriter_config_names_tf_trt_optimizer_and_its_parameters():
    config = trt.get_tensorrt_rewriter_config(params(precision_mode="FP16", minimum_segment_size=5),
                                              is_dynamic_op=False, max_batch_size=8)
    assert list(config.optimizers) == ["pruning", "debug_stripper", "layout", "dependency", "constfold",
                                       "common_subgraph_elimination"]
    assert [o.name for o in config.custom_optimizers] == ["TensorRTOptimizer", "constfold"]
    assert config.meta_optimizer_iterations == RC.ONE and config.remapping == RC.OFF
    p = config.custom_optimizers[0].parameter_map
    assert {k: p[k].WhichOneof("value") and getattr(p[k], p[k].WhichOneof("value")) for k in p} == {
        "minimum_segment_size": 5, "max_workspace_size_bytes": 1 << 30, "precision_mode": b"FP16",
        "maximum_cached_engines": 1, "use_calibration": True, "is_dynamic_op": False,
        "allow_build_at_runtime": True, "max_batch_size": 8, "use_implicit_batch": True}


def test_explicit_batch_adds_the_lowercased_profile_strategy():
    config = trt.get_tensorrt_rewriter_config(params(), is_dynamic_op=True, use_implicit_batch=False,
                                              profile_strategy="Range+Optimal")
    assert config.custom_optimizers[0].parameter_map["profile_strategy"].s == b"range+optimal"


def test_disable_non_trt_optimizers_leaves_only_the_tensorrt_pass():
    config = trt.get_tensorrt_rewriter_config(params(), is_dynamic_op=True, disable_non_trt_optimizers=True)
    assert list(config.optimizers) == [] and [o.name for o in config.custom_optimizers] == ["TensorRTOptimizer"]
    assert config.constant_folding == RC.OFF and config.layout_optimizer == RC.OFF
    assert config.disable_model_pruning and not config.disable_meta_optimizer and config.min_graph_nodes == -1


@pytest.mark.parametrize("kwargs, message", [
    (dict(is_dynamic_op=None), "is_dynamic_op can't be None for TF1"),
    (dict(is_dynamic_op=False, is_v2=True), "is_dynamic_op is either None or True for TF2"),
    (dict(is_dynamic_op=True, max_batch_size=4), "max_batch_size has to be None"),
    (dict(is_dynamic_op=False), "max_batch_size has to be an integer for is_dynamic_op==False in TF1"),
])
def test_tf_trt_argument_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        trt.get_tensorrt_rewriter_config(params(), **kwargs)


def run_session(config, x):
    """Run the graph in a session configured with `config`: (output, the session's engine ops), the ops read
    before the session closes (they go with it)."""
    with tf.Graph().as_default():
        inp = tf.compat.v1.placeholder(tf.float32, [None, 4], name="x")
        out = tf.identity(tf.tanh(tf.nn.relu(inp * 2.0 + 1.0)), name="y")
        session_config = tf.compat.v1.ConfigProto()
        session_config.graph_options.rewrite_options.CopyFrom(config)
        before = set(dispatcher.engine_ops())
        with tf.compat.v1.Session(config=session_config) as sess:
            result = sess.run(out, {inp: x})
            return result, [op for key, op in dispatcher.engine_ops().items() if key not in before]


def test_a_session_configured_with_it_converts_its_graph_online():
    x = random_array((3, 4))
    got, ops = run_session(trt.get_tensorrt_rewriter_config(params(), is_dynamic_op=True), x)
    np.testing.assert_allclose(got, np.tanh(np.maximum(x * 2 + 1, 0)), rtol=1e-5, atol=1e-6)
    assert len(ops) == 1 and ops[0].stats.engine_runs == 1 and not ops[0].stats.fallbacks


def test_minimum_segment_size_minus_one_converts_nothing_online():
    _, ops = run_session(trt.get_tensorrt_rewriter_config(params(minimum_segment_size=-1), is_dynamic_op=True),
                         random_array((2, 4)))
    assert ops == []
