"""Activations: one Activation layer each."""
from tftrt_py.convert.ops.base import OpConverter
from tftrt_py.convert.ops.registry import register

__all__ = ["ActivationConverter", "ACTIVATIONS"]

#: TF op -> (activation type, alpha attr or value, beta value)
ACTIVATIONS = {
    "Relu": ("relu", None, None),
    "Relu6": ("relu6", None, None),
    "Sigmoid": ("sigmoid", None, None),
    "Tanh": ("tanh", None, None),
    "Elu": ("elu", 1.0, None),
    "Selu": ("selu", None, None),
    "Softplus": ("softplus", None, None),
    "Softsign": ("softsign", None, None),
    "LeakyRelu": ("leaky_relu", "alpha", None),
}


@register(*ACTIVATIONS)
class ActivationConverter(OpConverter):
    def convert(self, node, ctx):
        kind, alpha, beta = ACTIVATIONS[node.op]
        if isinstance(alpha, str):
            alpha = float(node.attr(alpha))
        params = {"type": kind}
        if alpha is not None:
            params["alpha"] = alpha
        if beta is not None:
            params["beta"] = beta
        ctx.set_outputs(node, ctx.add_layer("Activation", ctx.inputs(node)[:1], params, node=node))
