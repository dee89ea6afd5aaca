"""ResizeBilinear and ResizeNearestNeighbor as one Resize layer (NHWC, TF's coordinate rules)."""
import numpy as np

from tftrt_py.convert.ops.base import ANY, FLOAT_INT, STATIC, OpConverter
from tftrt_py.convert.ops.registry import register

__all__ = ["ResizeConverter", "RESIZE"]

#: TF op -> Resize mode
RESIZE = {"ResizeBilinear": "linear", "ResizeNearestNeighbor": "nearest"}


@register(*RESIZE)
class ResizeConverter(OpConverter):
    """NHWC images; size known when building; align_corners or half_pixel_centers (not both).
    ResizeBilinear always gives float32."""

    allowed_dtypes = FLOAT_INT
    input_spec = (ANY, STATIC)
    needs_rank = True

    def validate(self, node, ctx):
        images, size = ctx.input_infos(node)
        if images.rank != 4:
            return f"{node.op} needs a 4-d NHWC input, got rank {images.rank}"
        if node.attr("align_corners", False) and node.attr("half_pixel_centers", False):
            return f"{node.op} with both align_corners and half_pixel_centers is invalid"
        if size.value is not None and (np.size(size.value) != 2 or np.min(size.value) <= 0):
            return f"{node.op} needs two positive sizes, got {np.ravel(size.value).tolist()}"
        return None

    def convert(self, node, ctx):
        images, size = ctx.inputs(node)
        params = {"mode": RESIZE[node.op], "sizes": [int(s) for s in np.ravel(size.value)],
                  "align_corners": bool(node.attr("align_corners", False)),
                  "half_pixel_centers": bool(node.attr("half_pixel_centers", False))}
        ctx.set_outputs(node, ctx.add_layer("Resize", [images], params, node=node))
