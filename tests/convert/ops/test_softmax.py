"""Softmax becomes one Softmax layer over the last axis and matches TensorFlow."""
import pytest
import tensorflow as tf

from support import assert_converts, frozen_graph_def, random_array
from tftrt_py.convert.context import ValidationContext
from tftrt_py.convert.graph import GraphView
from tftrt_py.convert.ops import get_converter


@pytest.mark.parametrize("shape", [(7,), (1, 7), (3, 10), (2, 3, 4, 5)])
def test_softmax_matches_tf(shape):
    assert_converts(tf.nn.softmax, [random_array(shape, high=6.0)], expect_kinds=["Softmax"])


def test_float64_is_refused():
    view = GraphView(frozen_graph_def(tf.nn.softmax, [tf.TensorSpec((2, 3), tf.float64)])[0])
    node = next(n for n in view.nodes.values() if n.op == "Softmax")
    assert "float64" in get_converter("Softmax").check(node, ValidationContext(view))


@pytest.mark.parametrize("shape", [(7,), (1, 7), (3, 10), (2, 3, 4, 5)])
def test_log_softmax_matches_tf(shape):
    assert_converts(tf.nn.log_softmax, [random_array(shape, high=6.0)], expect_kinds=["Reduce"])


def test_log_softmax_of_far_apart_logits_stays_finite():
    """log(softmax(x)) would be -inf where softmax underflows; TF's LogSoftmax and ours are not."""
    x = random_array((2, 6)) * 60.0
    engine = assert_converts(tf.nn.log_softmax, [x], rtol=1e-5, atol=1e-4)
    assert "Softmax" not in {layer.kind for layer in engine.network.layers}
