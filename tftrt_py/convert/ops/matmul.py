"""MatMul as one MatrixMultiply layer; either operand may be a constant."""
from tftrt_py.convert.ops.base import OpConverter
from tftrt_py.convert.ops.registry import register

__all__ = ["MatMulConverter"]


@register("MatMul")
class MatMulConverter(OpConverter):
    def convert(self, node, ctx):
        params = {"transpose_a": bool(node.attr("transpose_a")), "transpose_b": bool(node.attr("transpose_b"))}
        ctx.set_outputs(node, ctx.add_layer("MatrixMultiply", ctx.inputs(node), params, node=node))
