"""What layer kinds' params may name: the ops of ElementWise, Unary and Reduce, the activation types, and the
padding and resize modes. Kinds check their params against these (see :mod:`layers`); fusions, kernels and tests
enumerate them."""
from __future__ import annotations

__all__ = ["ELEMENTWISE_OPS", "COMPARISONS", "UNARY_OPS", "ACTIVATIONS", "REDUCE_OPS", "PADDING_MODES",
           "RESIZE_MODES"]

#: ElementWise ops; comparisons produce bool.
ELEMENTWISE_OPS = ("sum", "sub", "prod", "div", "max", "min", "pow", "floor_div", "floor_mod",
                   "squared_difference", "equal", "greater", "greater_equal", "less", "less_equal",
                   "not_equal", "and", "or", "bitwise_and")
COMPARISONS = ("equal", "greater", "greater_equal", "less", "less_equal", "not_equal")
UNARY_OPS = ("exp", "log", "sqrt", "rsqrt", "recip", "abs", "neg", "sin", "cos", "tan", "sinh", "cosh",
             "asin", "acos", "atan", "asinh", "acosh", "atanh", "ceil", "floor", "round", "sign", "erf",
             "square", "not", "erfc")
#: Activation types. hard_sigmoid is relu6(x + 3) / 6, or relu6(x + 3) * alpha where alpha is given (Keras writes
#: both: its backend divides by 6, MobileNetV3 multiplies by float32(1/6)); hard_swish is x * hard_sigmoid(x).
ACTIVATIONS = ("relu", "relu6", "clip", "leaky_relu", "elu", "selu", "sigmoid", "tanh", "softplus",
               "softsign", "gelu_erf", "gelu_tanh", "swish", "hard_sigmoid", "hard_swish")
#: Reduce ops; the last five come from the builder's reduction fusions (norms and log-sums).
REDUCE_OPS = ("sum", "mean", "max", "min", "prod", "l1", "sum_squares", "l2", "log_sum", "log_sum_exp")
#: Padding modes: constant (Pad, PadV2) and MirrorPad's two.
PADDING_MODES = ("constant", "reflect", "symmetric")
#: Resize modes and their TF ops: nearest (ResizeNearestNeighbor) and linear (ResizeBilinear).
RESIZE_MODES = ("nearest", "linear")
