"""Quantization ops (QuantizeAndDequantizeV2/V3/V4, FakeQuantWithMinMaxVars/Args) as INT8 ranges (user
guide 2.9.2): in precision_mode INT8 each gives its input tensor a symmetric dynamic range and passes the
value through (the engine quantizes where a layer runs in int8); FP8 (our extension) takes the same ranges
(scale range / 448 instead of / 127); in FP32 and FP16 they do not convert, so they stay native and split
the graph.

A range on a tensor that a fusion removes is ignored; a second range on one tensor widens it.
"""
from typing import Optional, Tuple

import numpy as np

from tftrt_py.calibration.ranges import set_range
from tftrt_py.convert.ops.base import ANY, WEIGHT, OpConverter
from tftrt_py.convert.ops.registry import register
from tftrt_py.engine.builder.precision import QUANTIZED
from tftrt_py.engine.network import Tensor

__all__ = ["QuantizeAndDequantizeConverter", "FakeQuantWithMinMaxVarsConverter", "FakeQuantWithMinMaxArgsConverter",
           "NUM_BITS"]

#: TensorRT quantizes to 8 bits.
NUM_BITS = 8


def _scalar(value) -> Optional[float]:
    value = np.asarray(value)
    return float(value) if value.size == 1 and np.isfinite(value).all() else None


class _RangeConverter(OpConverter):
    """Shared: INT8 or FP8 only, 8 bits, a finite per-tensor range; convert sets the range and forwards input 0."""

    precisions = QUANTIZED

    def range(self, node, ctx) -> Tuple[Optional[float], Optional[float]]:
        """(min, max) the node gives, None where it is not a finite scalar."""
        raise NotImplementedError

    def num_bits(self, node, ctx):
        return node.attr("num_bits", NUM_BITS)

    def validate(self, node, ctx):
        if ctx.precision not in QUANTIZED:
            return (f"{node.op} only gives a quantization range; it converts with precision_mode "
                    f"{' or '.join(repr(p) for p in QUANTIZED)}")
        if self.num_bits(node, ctx) != NUM_BITS:
            return f"{node.op} with num_bits={self.num_bits(node, ctx)} is not supported (INT8 needs {NUM_BITS})"
        if node.attr("axis", -1) != -1:
            return f"{node.op} with axis={node.attr('axis')}: per-channel quantization ranges are not supported"
        lo, hi = self.range(node, ctx)
        if lo is None or hi is None:
            return f"{node.op} needs a finite scalar quantization range"
        return None

    def convert(self, node, ctx):
        x = ctx.inputs(node)[0]
        if isinstance(x, Tensor):
            set_range(x, *self.range(node, ctx))
        ctx.set_outputs(node, [x])


@register("QuantizeAndDequantizeV2", "QuantizeAndDequantizeV3", "QuantizeAndDequantizeV4")
class QuantizeAndDequantizeConverter(_RangeConverter):
    """input_min and input_max constant scalars (axis=-1), 8 bits (V3: a constant num_bits); the range is
    taken whatever range_given says, as TF-TRT does. V4 (what tf.quantization.quantize_and_dequantize_v2
    emits) is V2 with another gradient."""

    input_spec = (ANY, WEIGHT, WEIGHT, WEIGHT)

    def range(self, node, ctx):
        infos = ctx.input_infos(node)
        return _scalar(infos[1].value), _scalar(infos[2].value)

    def num_bits(self, node, ctx):
        if node.op == "QuantizeAndDequantizeV3":
            value = _scalar(ctx.input_infos(node)[3].value)
            return None if value is None else int(value)
        return node.attr("num_bits", NUM_BITS)


@register("FakeQuantWithMinMaxVars")
class FakeQuantWithMinMaxVarsConverter(_RangeConverter):
    """min and max constant scalars (frozen variables), num_bits=8."""

    allowed_dtypes = ("float32",)  # FakeQuant ops have no dtype attribute: TF defines them for float32 only
    dtype_attr = None
    input_spec = (ANY, WEIGHT, WEIGHT)

    def range(self, node, ctx):
        infos = ctx.input_infos(node)
        return _scalar(infos[1].value), _scalar(infos[2].value)


@register("FakeQuantWithMinMaxArgs")
class FakeQuantWithMinMaxArgsConverter(_RangeConverter):
    """The min and max attributes (TF's defaults -6 and 6), num_bits=8."""

    allowed_dtypes = ("float32",)
    dtype_attr = None
    input_spec = (ANY,)

    def range(self, node, ctx):
        return _scalar(node.attr("min", -6.0)), _scalar(node.attr("max", 6.0))
