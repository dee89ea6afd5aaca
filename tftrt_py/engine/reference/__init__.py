"""The reference kernels: every layer kind in numpy, on the CPU; the numpy backend runs them and the other
backends, the builder's constant folding and the tests compare against them.

One short function per layer kind, registered in ``KERNELS``. Each takes the layer and its input arrays and
returns the output arrays. Accumulation is in float32 (float64 for the few ops numpy would otherwise lose
accuracy on), results cast to the layer's dtype.
"""
from tftrt_py.engine.reference.data import linear_weights, nearest_index, slice_stop
from tftrt_py.engine.reference.nn import conv_sums
from tftrt_py.engine.reference.pointwise import (ACTIVATION_FNS, ELEMENTWISE_FNS, REDUCE_FNS, SELU_ALPHA, SELU_SCALE,
                                                 UNARY_FNS, apply_activation, stable_softmax)
from tftrt_py.engine.reference.registry import KERNELS, kernel

__all__ = ["KERNELS", "kernel", "ACTIVATION_FNS", "UNARY_FNS", "ELEMENTWISE_FNS", "REDUCE_FNS", "SELU_ALPHA",
           "SELU_SCALE", "apply_activation", "stable_softmax", "conv_sums", "slice_stop", "nearest_index",
           "linear_weights"]
