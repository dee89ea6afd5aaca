"""Inference-mode FusedBatchNorm (V1-V3) becomes one per-channel Scale layer and matches TensorFlow."""
import pytest
import tensorflow as tf

from support import assert_converts, frozen_graph_def, random_array
from tftrt_py.convert.context import ValidationContext
from tftrt_py.convert.graph import GraphView
from tftrt_py.convert.ops import get_converter

OPS = {"FusedBatchNorm": tf.raw_ops.FusedBatchNorm, "FusedBatchNormV2": tf.raw_ops.FusedBatchNormV2,
       "FusedBatchNormV3": tf.raw_ops.FusedBatchNormV3}


def batch_norm(op, channels, fmt, is_training=False):
    scale, offset, mean = (random_array((channels,)) for _ in range(3))
    variance = random_array((channels,), positive=True)
    return lambda t: OPS[op](x=t, scale=scale, offset=offset, mean=mean, variance=variance, epsilon=1e-3,
                             data_format=fmt, is_training=is_training)[0]


@pytest.mark.parametrize("op", sorted(OPS))
@pytest.mark.parametrize("fmt,shape", [("NHWC", (1, 4, 5, 3)), ("NHWC", (2, 4, 5, 3)), ("NCHW", (1, 3, 4, 5)),
                                       ("NCHW", (2, 3, 4, 5))])
def test_batch_norm_matches_tf(op, fmt, shape):
    assert_converts(batch_norm(op, 3, fmt), [random_array(shape)], expect_kinds=["Scale"])


@pytest.mark.parametrize("fmt,shape", [("NDHWC", (2, 2, 3, 4, 3)), ("NCDHW", (2, 3, 2, 3, 4))])
def test_3d_batch_norm_matches_tf(fmt, shape):
    """V3 also takes 5-d layouts: channels last for NDHWC, axis 1 for NCDHW."""
    assert_converts(batch_norm("FusedBatchNormV3", 3, fmt), [random_array(shape)], expect_kinds=["Scale"])


def test_training_mode_is_refused():
    fn = batch_norm("FusedBatchNormV3", 3, "NHWC", is_training=True)
    view = GraphView(frozen_graph_def(fn, [tf.TensorSpec((2, 4, 4, 3))])[0])
    node = next(n for n in view.nodes.values() if n.op == "FusedBatchNormV3")
    assert "is_training" in get_converter("FusedBatchNormV3").check(node, ValidationContext(view))
