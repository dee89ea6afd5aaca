"""SpaceToBatchND and BatchToSpaceND as layers that only move entries (a zero Padding, two Shuffles, a Slice of the
crops; engine/layer_geometry.py), exact in every dtype. TF writes a dilated convolution as SpaceToBatchND -> Conv2D
(or DepthwiseConv2dNative) -> BatchToSpaceND; the builder fuses that chain back into one dilated Convolution
(builder/fusions/conv.py)."""
import numpy as np

from tftrt_py.convert.errors import InvalidNodeError
from tftrt_py.convert.ops.base import ANY, EXACT_INT64, NO_PRECISION, WEIGHT, OpConverter
from tftrt_py.convert.ops.registry import register
from tftrt_py.engine.errors import NetworkError
from tftrt_py.engine.layer_geometry import batch_to_space_layers, space_to_batch_layers

__all__ = ["SpaceToBatchConverter", "BatchToSpaceConverter"]


def _constants_reason(node, x, block, pairs, what):
    """Why the constant block_shape and paddings (or crops) do not fit the op on x, or None."""
    block = [int(b) for b in np.ravel(block)]
    pairs = np.asarray(pairs)
    if not block or any(b < 1 for b in block):
        return f"{node.op} block_shape {block} must hold one or more sizes >= 1"
    if pairs.shape != (len(block), 2) or np.any(pairs < 0):
        return f"{node.op} {what} {pairs.tolist()} must be [{len(block)}, 2] values >= 0"
    if x.rank is not None and x.rank < 1 + len(block):
        return f"{node.op} of a rank-{x.rank} input with {len(block)} block dims"
    return None


class _Rearranging(OpConverter):
    allowed_dtypes = EXACT_INT64
    input_spec = (ANY, WEIGHT, WEIGHT)
    precisions = NO_PRECISION
    needs_rank = True
    #: the layers of the op (layer_geometry) given x's shape, the block and the pairs
    layers = None
    what = ""

    def validate(self, node, ctx):
        x, block, pairs = ctx.input_infos(node)
        reason = _constants_reason(node, x, block.value, pairs.value, self.what)
        if reason is None and x.shape is not None and all(d is not None for d in x.shape):
            reason = self._shape_reason(x.shape, block.value, pairs.value)
        return reason

    def _shape_reason(self, shape, block, pairs):
        try:
            self._layers(shape, block, pairs)
        except NetworkError as exc:
            return str(exc)
        return None

    def _layers(self, shape, block, pairs):
        block = [int(b) for b in np.ravel(block)]
        pairs = np.asarray(pairs, np.int64).reshape(len(block), 2)
        return type(self).layers(shape, block, pairs[:, 0].tolist(), pairs[:, 1].tolist())

    def convert(self, node, ctx):
        x, block, pairs = ctx.inputs(node)
        try:
            layers = self._layers(tuple(x.shape), block.value, pairs.value)
        except NetworkError as exc:  # shapes are concrete only now
            raise InvalidNodeError(str(exc), node) from None
        for i, (kind, params) in enumerate(layers):
            x = ctx.add_layer(kind, [x], params, node=node, suffix=f"/{i}")[0]
        ctx.set_outputs(node, [x])


@register("SpaceToBatchND")
class SpaceToBatchConverter(_Rearranging):
    """block_shape and paddings constant; each padded spatial dim a multiple of its block."""

    layers = staticmethod(space_to_batch_layers)
    what = "paddings"


@register("BatchToSpaceND")
class BatchToSpaceConverter(_Rearranging):
    """block_shape and crops constant; the batch a multiple of the block's volume, crops leaving entries."""

    layers = staticmethod(batch_to_space_layers)
    what = "crops"
