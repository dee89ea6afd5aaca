"""Ops that make tensors from a shape: Fill (dims known when building), Range (all operands known),
ZerosLike and OnesLike (the input's shape).

Fill of a constant value, Range, ZerosLike and OnesLike are Weights (no layer); Fill of a tensor value
broadcasts it with one ElementWise product against ones, which is exact. Sized by the batch (a dim 0 of
tf.shape(x)[0], or like a tensor), they are rows of it: the engine stays row-wise.
"""
import numpy as np

from tftrt_py.convert.errors import InvalidNodeError
from tftrt_py.convert.ops.base import ANY, FLOAT_INT, FLOAT_INT_BOOL, NO_PRECISION, STATIC, OpConverter
from tftrt_py.convert.ops.registry import register
from tftrt_py.convert.values import Weights, shape_of

__all__ = ["FillConverter", "RangeConverter", "LikeConverter", "LIKE"]

#: TF op -> the value filling a tensor shaped like its input
LIKE = {"ZerosLike": 0, "OnesLike": 1}


@register("Fill")
class FillConverter(OpConverter):
    """dims known when building (a constant or computed from shapes); the value a scalar constant or tensor."""

    allowed_dtypes = FLOAT_INT_BOOL
    input_spec = (STATIC, ANY)
    precisions = NO_PRECISION

    def validate(self, node, ctx):
        value = ctx.input_infos(node)[1]
        if value.shape is not None and len(value.shape) != 0:
            return f"Fill needs a scalar value, got shape {list(value.shape)}"
        return None

    def convert(self, node, ctx):
        dims, value = ctx.inputs(node)
        shape = [int(d) for d in np.ravel(dims.value)]
        if isinstance(value, Weights):
            full = np.full(shape, value.value, dtype=value.dtype)
            out = Weights.derived(full, dims, value) if value.batch_source is not None else Weights.sized(full, dims)
            ctx.set_outputs(node, [out])
            return
        value = ctx.add_layer("Shuffle", [value], {"reshape": [1] * len(shape)}, node=node, suffix="/reshape")[0]
        ones = Weights.sized(np.ones(shape, dtype=value.dtype), dims)
        ctx.set_outputs(node, ctx.add_layer("ElementWise", [ones, value], {"op": "prod"}, node=node))


@register("Range")
class RangeConverter(OpConverter):
    """start, limit and delta known when building: the result is a constant."""

    allowed_dtypes = FLOAT_INT
    dtype_attr = "Tidx"
    input_spec = (STATIC,)
    precisions = NO_PRECISION

    def convert(self, node, ctx):
        dtype = np.dtype(node.attr("Tidx"))
        start, limit, delta = (np.asarray(v.value, dtype).reshape(()) for v in ctx.inputs(node))
        reason = _range_reason(start, limit, delta)  # operands from shapes are known only now
        if reason is not None:
            raise InvalidNodeError(reason, node)
        if dtype.kind == "i":  # as TF computes the size: exactly for integers, in the dtype for floats
            size = (abs(int(limit) - int(start)) + abs(int(delta)) - 1) // abs(int(delta))
        else:
            size = int(np.ceil(np.abs((limit - start) / delta)))
        values = start + np.arange(size, dtype=dtype) * delta
        ctx.set_outputs(node, [Weights.derived(np.asarray(values, dtype), *ctx.inputs(node))])


def _range_reason(start, limit, delta):
    """Why TF's Range rejects these operands (it raises), or None."""
    start, limit, delta = (np.asarray(v).reshape(()) for v in (start, limit, delta))
    if delta == 0 or (limit - start) * np.sign(delta) < 0:
        return f"Range({start}, {limit}, {delta}) is invalid: delta must be non-zero and step towards limit"
    return None


@register(*LIKE)
class LikeConverter(OpConverter):
    """A constant shaped like the input (known when building, as every shape is then): rows of its batch."""

    allowed_dtypes = FLOAT_INT_BOOL
    static_outputs = True
    precisions = NO_PRECISION

    def convert(self, node, ctx):
        x = ctx.inputs(node)[0]
        ctx.set_outputs(node, [Weights.sized(np.full(x.shape, LIKE[node.op], dtype=x.dtype), shape_of(x))])
