"""Shape ops: Reshape and Squeeze as a Shuffle, Pad/PadV2 as Padding, ConcatV2 as Concatenation.

Constant operands (target shape, paddings, pad value, axis) are read at conversion time,
when every shape is concrete.
"""
import numpy as np

from tftrt_py.convert.ops.base import ANY, FLOAT_INT, EXACT_INT64, STATIC, WEIGHT, OpConverter
from tftrt_py.convert.ops.registry import register

__all__ = ["ReshapeConverter", "SqueezeConverter", "PadConverter", "ConcatConverter", "resolve_reshape"]


def resolve_reshape(shape, target):
    """`target` with its -1 (if any) replaced by the size that keeps the element count of `shape`."""
    dims = [int(d) for d in np.ravel(target)]
    if -1 in dims:
        known = int(np.prod([d for d in dims if d != -1]))
        dims[dims.index(-1)] = int(np.prod(shape)) // known if known else 0
    return dims


@register("Reshape")
class ReshapeConverter(OpConverter):
    """The target shape is known when building: a constant, or computed from shapes (tf.shape(x))."""

    allowed_dtypes = EXACT_INT64
    input_spec = (ANY, STATIC)

    def convert(self, node, ctx):
        x, target = ctx.inputs(node)
        params = {"reshape": resolve_reshape(x.shape, target.value)}
        ctx.set_outputs(node, ctx.add_layer("Shuffle", [x], params, node=node))


@register("Squeeze")
class SqueezeConverter(OpConverter):
    """Drops the squeeze_dims (negative allowed), or every size-1 dim when squeeze_dims is empty."""

    allowed_dtypes = EXACT_INT64

    def validate(self, node, ctx):
        shape = ctx.input_infos(node)[0].shape
        if not node.attr("squeeze_dims") and (shape is None or None in shape):
            return "squeezing every size-1 dim (empty squeeze_dims) needs a fully known input shape"
        return None

    def convert(self, node, ctx):
        x = ctx.inputs(node)[0]
        rank = len(x.shape)
        dims = {d % rank for d in node.attr("squeeze_dims")} or {i for i, d in enumerate(x.shape) if d == 1}
        params = {"reshape": [int(d) for i, d in enumerate(x.shape) if i not in dims]}
        ctx.set_outputs(node, ctx.add_layer("Shuffle", [x], params, node=node))


@register("Pad", "PadV2")
class PadConverter(OpConverter):
    """Constant padding with 0 (Pad) or the constant scalar constant_values (PadV2)."""

    allowed_dtypes = FLOAT_INT
    input_spec = (ANY, WEIGHT)

    def convert(self, node, ctx):
        x, paddings, *value = ctx.inputs(node)
        pads = np.asarray(paddings.value).reshape(-1, 2)
        params = {"pre": [int(a) for a in pads[:, 0]], "post": [int(b) for b in pads[:, 1]], "mode": "constant",
                  "value": np.asarray(value[0].value).item() if value else 0}
        ctx.set_outputs(node, ctx.add_layer("Padding", [x], params, node=node))


@register("ConcatV2")
class ConcatConverter(OpConverter):
    """Any number of tensors or constants along a constant (possibly negative) axis."""

    allowed_dtypes = EXACT_INT64

    def validate(self, node, ctx):
        return None if ctx.input_infos(node)[-1].value is not None else "the concat axis must be a constant"

    def convert(self, node, ctx):
        *values, axis = ctx.inputs(node)
        params = {"axis": int(axis.value) % len(values[0].shape)}
        ctx.set_outputs(node, ctx.add_layer("Concatenation", values, params, node=node))
