"""Layer implementations for the cupy backend, registered by layer kind (see ``base.FACTORIES``)."""
from tftrt_py.engine.backends.cupy.ops import (attention, conv, deconv, layout, matmul, pooling,  # noqa: F401
                                              reduce, resize, select)
from tftrt_py.engine.backends.cupy.ops.base import FACTORIES, BuildOptions, Op, Spec  # noqa: F401
from tftrt_py.engine.backends.cupy.ops.pointwise import POINTWISE_KINDS, PointwiseOp  # noqa: F401
