"""Op converters, one module per op family; importing this package registers them all."""
from tftrt_py.convert.ops.registry import find_converter, get_converter, register, registered_ops

from tftrt_py.convert.ops import (  # noqa: F401,E402  (registration)
    activation,
    arg,
    batchnorm,
    bias,
    cast,
    conv,
    deconv,
    einsum,
    elementwise,
    gather,
    generate,
    identity,
    logical,
    matmul,
    nms,
    one_hot,
    pooling,
    quantize,
    reduce,
    resize,
    select,
    shape,
    shape_info,
    slicing,
    softmax,
    space_batch,
    stacking,
    tile,
    topk,
    unary,
)

__all__ = ["register", "get_converter", "find_converter", "registered_ops"]
