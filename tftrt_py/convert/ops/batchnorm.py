"""Inference-mode FusedBatchNorm (V1-V3) as one per-channel Scale layer.

y = x * s + (offset - mean * s) with s = scale / sqrt(variance + epsilon). Only output 0 (y)
is set: outputs 1..5 (batch statistics and reserve spaces) are unused at inference, and a
segment reading them fails to convert rather than being refused here (converters cannot see
consumers; the segmenter decides which nodes go into a segment).
"""
import numpy as np

from tftrt_py.convert.ops.base import ANY, WEIGHT, OpConverter
from tftrt_py.convert.ops.registry import register

__all__ = ["FusedBatchNormConverter", "CHANNEL_AXIS"]

#: data_format -> channel axis
CHANNEL_AXIS = {b"NHWC": -1, b"NDHWC": -1, b"NCHW": 1, b"NCDHW": 1}


@register("FusedBatchNorm", "FusedBatchNormV2", "FusedBatchNormV3")
class FusedBatchNormConverter(OpConverter):
    input_spec = (ANY, WEIGHT)

    def validate(self, node, ctx):
        if node.attr("is_training", True):
            return "is_training=True (batch statistics) is not supported; only inference mode converts"
        return None

    def convert(self, node, ctx):
        x, *consts = ctx.inputs(node)
        gamma, beta, mean, var = (c.value.astype(np.float64) for c in consts)
        scale = gamma / np.sqrt(var + node.attr("epsilon", 1e-4))
        shift = beta - mean * scale
        params = {"channel_axis": CHANNEL_AXIS[node.attr("data_format", b"NHWC")]}
        weights = {"scale": scale.astype(x.dtype), "shift": shift.astype(x.dtype)}
        ctx.set_outputs(node, ctx.add_layer("Scale", [x], params, weights, node=node))
