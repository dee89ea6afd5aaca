"""Layer implementations for the cupy backend, registered by layer kind and, for INT8 and FP8 layers, format
(see ``base.FACTORIES`` and ``base.QUANTIZED_FACTORIES``)."""
from tftrt_py.engine.backends.cupy.ops import (attention, conv, deconv, fp8, int8, layout, matmul,  # noqa: F401
                                              pooling, reduce, resize, select)
from tftrt_py.engine.backends.cupy.ops.base import FACTORIES, BuildOptions, Op, Spec  # noqa: F401
from tftrt_py.engine.backends.cupy.ops.pointwise import POINTWISE_KINDS, PointwiseOp  # noqa: F401
