"""Softmax and LogSoftmax over the last axis.

Softmax is one Softmax layer. LogSoftmax is x - max - log(sum(exp(x - max))) in five layers,
which keeps very negative log-probabilities finite where log(softmax(x)) would give -inf.
"""
from tftrt_py.convert.ops.base import OpConverter
from tftrt_py.convert.ops.registry import register

__all__ = ["SoftmaxConverter", "LogSoftmaxConverter"]


@register("Softmax")
class SoftmaxConverter(OpConverter):
    def convert(self, node, ctx):
        x = ctx.inputs(node)[0]
        ctx.set_outputs(node, ctx.add_layer("Softmax", [x], {"axis": len(x.shape) - 1}, node=node))


@register("LogSoftmax")
class LogSoftmaxConverter(OpConverter):
    def convert(self, node, ctx):
        x = ctx.inputs(node)[0]
        last = [len(x.shape) - 1]

        def layer(kind, inputs, params, suffix):
            return ctx.add_layer(kind, inputs, params, node=node, suffix=suffix)[0]

        peak = layer("Reduce", [x], {"op": "max", "axes": last, "keep_dims": True}, "/max")
        shifted = layer("ElementWise", [x, peak], {"op": "sub"}, "/shift")
        total = layer("Reduce", [layer("Unary", [shifted], {"op": "exp"}, "/exp")],
                      {"op": "sum", "axes": last, "keep_dims": True}, "/sum")
        ctx.set_outputs(node, [layer("ElementWise", [shifted, layer("Unary", [total], {"op": "log"}, "/log")],
                                     {"op": "sub"}, "")])
