"""BiasAdd as a Scale layer shifting the channel axis (last for NHWC, 1 for NCHW)."""
import numpy as np

from tftrt_py.convert.ops.base import ANY, WEIGHT, OpConverter
from tftrt_py.convert.ops.registry import register

__all__ = ["BiasAddConverter", "CHANNEL_AXIS"]

#: data_format -> channel axis the bias is added along
CHANNEL_AXIS = {b"NHWC": -1, b"NCHW": 1}


@register("BiasAdd")
class BiasAddConverter(OpConverter):
    input_spec = (ANY, WEIGHT)

    def convert(self, node, ctx):
        x, bias = ctx.inputs(node)
        params = {"channel_axis": CHANNEL_AXIS[node.attr("data_format", b"NHWC")]}
        ctx.set_outputs(node, ctx.add_layer("Scale", [x], params, {"shift": np.asarray(bias.value, x.dtype)},
                                            node=node))
