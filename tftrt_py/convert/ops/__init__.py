"""Op converters, one module per op family; importing this package registers them all."""
from tftrt_py.convert.ops.registry import find_converter, get_converter, register, registered_ops

from tftrt_py.convert.ops import (  # noqa: F401,E402  (registration)
    activation,
    arg,
    batchnorm,
    bias,
    conv,
    deconv,
    elementwise,
    gather,
    identity,
    matmul,
    nms,
    pooling,
    reduce,
    shape,
    slicing,
    softmax,
    stacking,
    topk,
    unary,
)

__all__ = ["register", "get_converter", "find_converter", "registered_ops"]
