"""CombinedNonMaxSuppression as one NMS layer; its sizes and thresholds are constants."""
import numpy as np

from tftrt_py.convert.ops.base import ANY, NO_PRECISION, WEIGHT, OpConverter
from tftrt_py.convert.ops.registry import register

__all__ = ["CombinedNMSConverter"]

#: the constant inputs, in input order (2..5), by their NMS layer param names
CONSTANT_INPUTS = ("max_output_size_per_class", "max_total_size", "iou_threshold", "score_threshold")


@register("CombinedNonMaxSuppression")
class CombinedNMSConverter(OpConverter):
    """Constant sizes and thresholds (iou_threshold in [0, 1]); computed in float32 as TF does."""

    dtype_attr = None  # boxes and scores are always float32
    precisions = NO_PRECISION
    input_spec = (ANY, ANY, WEIGHT)

    def validate(self, node, ctx):
        boxes, scores, *consts = ctx.input_infos(node)
        if boxes.rank not in (None, 4) or scores.rank not in (None, 3):
            return "CombinedNonMaxSuppression needs boxes [B, N, q, 4] and scores [B, N, C]"
        params = self.params(node, consts)
        if not 0.0 <= params["iou_threshold"] <= 1.0:
            return f"iou_threshold {params['iou_threshold']} must be in [0, 1]"
        if params["max_output_size_per_class"] <= 0 or params["max_total_size"] <= 0:
            return "max_output_size_per_class and max_total_size must be positive"
        return None

    @staticmethod
    def params(node, consts):
        params = {name: np.ravel(c.value)[0].item() for name, c in zip(CONSTANT_INPUTS, consts)}
        params.update(pad_per_class=bool(node.attr("pad_per_class", False)),
                      clip_boxes=bool(node.attr("clip_boxes", True)))
        return params

    def convert(self, node, ctx):
        boxes, scores, *consts = ctx.inputs(node)
        ctx.set_outputs(node, ctx.add_layer("NMS", [boxes, scores], self.params(node, consts), node=node))
