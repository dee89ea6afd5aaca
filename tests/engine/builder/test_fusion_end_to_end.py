"""Fusions on networks converted from TF graphs: names, logs, counts, the inspector and ResNet50."""
import logging

import numpy as np
import pytest
import tensorflow as tf

from support import assert_converts, random_array
from tftrt_py.convert.build import SegmentGraph, network_from_segment
from tftrt_py.convert.graph import GraphView
from tftrt_py.converters import graph_io
from tftrt_py.engine import Builder, Runtime
from tftrt_py.engine.builder import PIPELINE
from tftrt_py.engine.builder.fusions.match import fusion_counts
from tftrt_py.engine.inspector import format_layers
from tftrt_py.segmenter import segment_graph

K1, K2 = random_array((3, 3, 4, 4), high=0.5), random_array((3, 3, 4, 4), high=0.5)
BIAS, GAMMA, BETA = random_array((4,)), random_array((4,), positive=True), random_array((4,))


def residual_block(x):
    """conv2d + bias_add + batch-norm-like mul/add + relu, then conv2d + mul/add + residual add + relu."""
    y = tf.nn.relu(tf.nn.bias_add(tf.nn.conv2d(x, K1, 1, "SAME"), BIAS) * GAMMA + BETA)
    z = tf.nn.conv2d(y, K2, 1, "SAME") * GAMMA + BETA
    return tf.nn.relu(z + x)


def test_residual_block_becomes_two_convolutions(caplog):
    with caplog.at_level(logging.INFO, logger="tftrt_py.engine.builder"):
        engine = assert_converts(residual_block, [random_array((2, 8, 8, 4))])
    assert [l.name for l in engine.network.layers] == ["Conv2D + BiasAdd + mul + add + Relu",
                                                       "Conv2D_1 + mul_1 + add_1 + add_2 + Relu_1"]
    assert fusion_counts(engine.network) == {"Convolution + bias": 3, "Convolution + Scale": 2,
                                             "Convolution + residual sum": 1, "Convolution + Activation": 2}
    messages = [r.getMessage() for r in caplog.records]
    assert "Convolution + residual sum: Conv2D_1 + mul_1 + add_1 + add_2" in messages
    assert any(m.startswith("fusions in ") and "1 x Convolution + residual sum" in m for m in messages)


def test_pipeline_is_one_flat_list_of_named_passes():
    names = [name for name, _ in PIPELINE]
    assert names[:2] == ["constant folding", "dead-layer elimination"] and len(set(names)) == len(names)
    assert names.index("bias and scale folding") < names.index("residual fusion") < names.index("activation fusion")
    assert all(callable(p) for _, p in PIPELINE)


def test_inspector_formats_a_table():
    engine = assert_converts(residual_block, [random_array((2, 8, 8, 4))])
    lines = format_layers(engine).splitlines()
    assert lines[0].split() == ["name", "kind", "precision", "inputs", "outputs"]
    assert lines[2].startswith("Conv2D + BiasAdd + mul + add + Relu  ")
    assert lines[2].split()[-4:] == ["Convolution", "FP32", "2x8x8x4", "2x8x8x4"]
    assert lines[3].split()[-3:] == ["2x8x8x4", "2x8x8x4", "2x8x8x4"] and len(lines) == 4
    assert engine.inspect()[1]["inputs"] == [[2, 8, 8, 4], [2, 8, 8, 4]]


def test_fused_layers_survive_a_plan_round_trip():
    engine = assert_converts(residual_block, [random_array((2, 8, 8, 4))])
    x = random_array((2, 8, 8, 4))
    loaded = Runtime().deserialize_cuda_engine(engine.serialize())
    assert [l.name for l in loaded.network.layers] == [l.name for l in engine.network.layers]
    np.testing.assert_array_equal(loaded.create_execution_context().execute_v2([x])[0],
                                  engine.create_execution_context().execute_v2([x])[0])


@pytest.mark.slow
def test_resnet50_has_one_layer_per_convolution():
    from models.sample_models import build_keras_application

    model, _ = build_keras_application("resnet50", size=64)
    frozen = graph_io.freeze(tf.function(model).get_concrete_function(tf.TensorSpec((2, 64, 64, 3))))
    inputs, outputs = [t.name for t in frozen.inputs], [t.name for t in frozen.outputs]
    view = GraphView(graph_io.optimize(frozen.graph.as_graph_def(), frozen.graph, inputs + outputs))
    (segment,) = segment_graph(view, fetches=outputs).segments
    network = network_from_segment(SegmentGraph.from_graph_def(segment.graph_def(view)), [(2, 64, 64, 3)])
    before = len(network.layers)
    engine = Builder().build_engine(network)
    kinds = [l.kind for l in engine.network.layers]
    assert before > 200 and kinds.count("Convolution") == 53
    # plus the stem's max pool (its zero padding folds in) and the classifier (mean, weights, matmul, softmax)
    assert "Padding" not in kinds and len(kinds) <= 53 + 5
    x = random_array((2, 64, 64, 3))
    got = engine.create_execution_context().execute_v2([x])[0]
    np.testing.assert_allclose(got, model(x).numpy(), rtol=1e-4, atol=1e-6)
