"""CombinedNonMaxSuppression becomes one NMS layer and matches TensorFlow's four outputs exactly."""
import numpy as np
import pytest
import tensorflow as tf

from support import assert_converts, frozen_graph_def, random_array, run_engine
from tftrt_py.convert.context import ValidationContext
from tftrt_py.convert.graph import GraphView
from tftrt_py.convert.ops import get_converter


def check(fn, specs, op="CombinedNonMaxSuppression"):
    """The reason the converter gives for the first `op` node of `fn` traced with `specs`."""
    view = GraphView(frozen_graph_def(fn, specs)[0])
    node = next(n for n in view.nodes.values() if n.op == op)
    return get_converter(op).check(node, ValidationContext(view))


def nms(per_class, total, iou, score, pad_per_class=False, clip_boxes=True):
    return lambda b, s: tuple(tf.raw_ops.CombinedNonMaxSuppression(
        boxes=b, scores=s, max_output_size_per_class=per_class, max_total_size=total, iou_threshold=iou,
        score_threshold=score, pad_per_class=pad_per_class, clip_boxes=clip_boxes))


def boxes_and_scores(batch, n, q, classes):
    """Crowded boxes (so NMS suppresses), some past [0, 1] and some with swapped corners; distinct scores."""
    boxes = random_array((batch, n, q, 4), high=1.3, positive=True)
    return boxes, random_array((batch, n, classes), high=1.0, positive=True)


@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("shared_boxes", [True, False])
@pytest.mark.parametrize("pad_per_class", [False, True])
@pytest.mark.parametrize("clip_boxes", [True, False])
def test_nms_matches_tf(batch, shared_boxes, pad_per_class, clip_boxes):
    classes = 3
    boxes, scores = boxes_and_scores(batch, 20, 1 if shared_boxes else classes, classes)
    fn = nms(4, 9, 0.4, 0.3, pad_per_class, clip_boxes)
    assert_converts(fn, [boxes, scores], rtol=0, atol=0, expect_kinds=["NMS"])


@pytest.mark.parametrize("per_class,total", [(2, 100), (50, 7), (1, 1), (30, 30)])
@pytest.mark.parametrize("iou,score", [(0.0, 0.1), (0.5, 0.0), (1.0, 0.8), (0.3, -1.0)])
def test_nms_sizes_and_thresholds(per_class, total, iou, score):
    """Limits above and below the number of boxes, thresholds that keep all or few of them."""
    boxes, scores = boxes_and_scores(2, 12, 1, 4)
    assert_converts(nms(per_class, total, iou, score), [boxes, scores], rtol=0, atol=0, expect_kinds=["NMS"])


def test_nms_outputs_feed_other_layers():
    boxes, scores = boxes_and_scores(2, 10, 1, 2)
    fn = lambda b, s: tf.reduce_sum(nms(3, 5, 0.5, 0.2)(b, s)[1], axis=-1) * 2.0
    assert_converts(fn, [boxes, scores], expect_kinds=["NMS"])


def test_nonconstant_threshold_is_refused():
    fn = lambda b, s, t: tuple(tf.raw_ops.CombinedNonMaxSuppression(
        boxes=b, scores=s, max_output_size_per_class=3, max_total_size=5, iou_threshold=t, score_threshold=0.1))
    specs = [tf.TensorSpec((1, 6, 1, 4)), tf.TensorSpec((1, 6, 2)), tf.TensorSpec(())]
    assert check(fn, specs) == "input 4 of CombinedNonMaxSuppression must be a constant"


def test_iou_threshold_out_of_range_is_refused():
    fn = nms(3, 5, 1.5, 0.1)
    assert "iou_threshold" in check(fn, [tf.TensorSpec((1, 6, 1, 4)), tf.TensorSpec((1, 6, 2))])


def test_engine_serves_smaller_batches():
    """Rows are independent, so an engine built for batch 3 serves batch 2."""
    boxes, scores = boxes_and_scores(3, 8, 1, 2)
    engine, _ = run_engine(nms(2, 4, 0.5, 0.2), [boxes, scores])
    assert engine.rowwise
    got = engine.create_execution_context().execute_v2([boxes[:2], scores[:2]])
    want = nms(2, 4, 0.5, 0.2)(tf.constant(boxes[:2]), tf.constant(scores[:2]))
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)
