"""MatMul and the batched matmuls as one MatrixMultiply layer; either operand may be a constant.

MatrixMultiply has np.matmul semantics, so BatchMatMulV2/V3's broadcasting of batch dims carries over.
"""
from tftrt_py.convert.ops.base import OpConverter
from tftrt_py.convert.ops.registry import register

__all__ = ["MatMulConverter", "BatchMatMulV3Converter", "TRANSPOSE_ATTRS"]

#: TF op -> its (transpose_a, transpose_b) attribute names
TRANSPOSE_ATTRS = {
    "MatMul": ("transpose_a", "transpose_b"),
    "BatchMatMul": ("adj_x", "adj_y"),
    "BatchMatMulV2": ("adj_x", "adj_y"),
    "BatchMatMulV3": ("adj_x", "adj_y"),
}


@register("MatMul", "BatchMatMul", "BatchMatMulV2")
class MatMulConverter(OpConverter):
    """Operands of rank >= 2, either one a constant; transposes (adjoints) of either."""

    def validate(self, node, ctx):
        ranks = [info.rank for info in ctx.input_infos(node)]
        if any(r is not None and r < 2 for r in ranks):
            return f"{node.op} needs operands of rank >= 2, got ranks {ranks}"
        return None

    def convert(self, node, ctx):
        ta, tb = TRANSPOSE_ATTRS[node.op]
        params = {"transpose_a": bool(node.attr(ta)), "transpose_b": bool(node.attr(tb))}
        ctx.set_outputs(node, ctx.add_layer("MatrixMultiply", ctx.inputs(node), params, node=node))


@register("BatchMatMulV3")
class BatchMatMulV3Converter(MatMulConverter):
    """Operand dtypes are Ta and Tb, the result's Tout: all three must agree."""

    dtype_attr = "Tout"

    def validate(self, node, ctx):
        types = [node.attr(k) for k in ("Ta", "Tb", "Tout")]
        if len(set(types)) != 1:
            return f"BatchMatMulV3 with mixed dtypes Ta/Tb/Tout={'/'.join(map(str, types))} is not supported"
        return super().validate(node, ctx)
