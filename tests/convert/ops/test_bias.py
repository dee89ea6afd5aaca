"""BiasAdd becomes one Scale layer adding the bias along the channel axis, and matches TensorFlow."""
import pytest
import tensorflow as tf

from support import assert_converts, frozen_graph_def, random_array
from tftrt_py.convert.context import ValidationContext
from tftrt_py.convert.graph import GraphView
from tftrt_py.convert.ops import get_converter


@pytest.mark.parametrize("fmt,shape", [("NHWC", (1, 5)), ("NHWC", (2, 3, 5)), ("NHWC", (3, 4, 6, 5)),
                                       ("NCHW", (1, 5, 3)), ("NCHW", (3, 5, 4, 6)),
                                       ("NCHW", (2, 5, 2, 3, 4))])
def test_bias_add_matches_tf(fmt, shape):
    """NHWC adds along the last axis, NCHW along axis 1 (ranks 3 to 5)."""
    bias = random_array((5,))
    fn = lambda t: tf.raw_ops.BiasAdd(value=t, bias=bias, data_format=fmt)
    assert_converts(fn, [random_array(shape)], expect_kinds=["Scale"])


def test_int32_is_refused():
    view = GraphView(frozen_graph_def(lambda t: tf.nn.bias_add(t, [1, 2, 3]), [tf.TensorSpec((2, 3), tf.int32)])[0])
    node = next(n for n in view.nodes.values() if n.op == "BiasAdd")
    assert "int32" in get_converter("BiasAdd").check(node, ValidationContext(view))
