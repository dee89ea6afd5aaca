"""The op converter base: shared checks, then ``validate``, then ``convert``.

A converter declares ``allowed_dtypes`` (checked on each attribute named by ``dtype_attr``; list
attributes such as IdentityN's ``T`` are checked entry by entry) and an input spec, one kind per
input (the last entry repeats):

* ``WEIGHT``: a constant, whose value validators may read;
* ``STATIC``: known when the engine is built: a constant, or computed from constants and shapes
  (Shape -> StridedSlice -> Pack -> Reshape), since every shape is concrete while building;
* ``ANY``: a tensor or either of the above.

``needs_rank`` refuses inputs of unknown rank. ``validate(node, ctx)`` returns None or a reason;
it never leaves state for ``convert`` to read. ``constraints`` (default: the docstring's first line)
and ``precisions`` feed the ops page (:mod:`tftrt_py.convert.ops.docs`).
"""
from __future__ import annotations

import logging
from typing import Optional, Sequence, Tuple, Union

from tftrt_py.convert.errors import InvalidNodeError
from tftrt_py.engine.builder import PRECISIONS

__all__ = ["OpConverter", "WEIGHT", "STATIC", "ANY", "FLOAT", "INT", "BOOL", "FLOAT_INT", "FLOAT_INT_BOOL", "INT64",
           "EXACT_INT64", "ALL_PRECISIONS", "NO_PRECISION"]

logger = logging.getLogger(__name__)

WEIGHT, STATIC, ANY = "weight", "static", "any"

#: dtype policies, stated once and named by converters.
FLOAT = ("float32", "float16")
INT = ("int32",)
BOOL = ("bool",)
FLOAT_INT = FLOAT + INT
FLOAT_INT_BOOL = FLOAT_INT + BOOL
#: int64 where the result is exact in any engine dtype: data movement, comparisons, casts, sums and products
#: (index and shape paths), computed natively by both backends.
INT64 = ("int64",)
EXACT_INT64 = FLOAT_INT_BOOL + INT64

#: Builder precisions a converter's layers run in; NO_PRECISION: exact (data movement, int/bool, folded).
ALL_PRECISIONS = PRECISIONS
NO_PRECISION: Tuple[str, ...] = ()


class OpConverter:
    allowed_dtypes: Sequence[str] = FLOAT
    dtype_attr: Union[str, Sequence[str], None] = "T"
    input_spec: Sequence[str] = (ANY,)
    needs_rank: bool = False
    #: Outputs are known when building whatever the inputs hold (Shape, Size, Rank).
    static_outputs: bool = False
    precisions: Sequence[str] = ALL_PRECISIONS
    constraints: Optional[str] = None

    def validate(self, node, ctx) -> Optional[str]:
        """Op-specific checks (attributes, shapes). None when the node can convert."""
        return None

    def convert(self, node, ctx) -> None:
        raise NotImplementedError

    def check(self, node, ctx) -> Optional[str]:
        """Shared checks then :meth:`validate`; the reason the node cannot convert, or None."""
        reason = self.dtype_reason(node)
        if reason is not None:
            return reason
        for i, info in enumerate(ctx.input_infos(node)):
            kind = self.input_spec[min(i, len(self.input_spec) - 1)]
            if kind == WEIGHT and info.value is None:
                return f"input {i} of {node.op} must be a constant"
            if kind == STATIC and not info.static:
                return f"input {i} of {node.op} must be known when building (a constant, or computed from " \
                       f"constants and shapes)"
            if self.needs_rank and info.rank is None:
                return f"input {i} of {node.op} has an unknown rank"
        return self.validate(node, ctx)

    def dtype_reason(self, node) -> Optional[str]:
        """Why a dtype attribute of `node` is outside ``allowed_dtypes``, or None."""
        attrs = (self.dtype_attr,) if isinstance(self.dtype_attr, str) else tuple(self.dtype_attr or ())
        for attr in attrs:
            value = node.attr(attr)
            for dtype in value if isinstance(value, list) else [value]:
                if dtype is not None and dtype not in self.allowed_dtypes:
                    return (f"{node.op} with {attr}={dtype} is not supported "
                            f"(supported: {', '.join(self.allowed_dtypes)})")
        return None

    def __call__(self, node, ctx) -> None:
        reason = self.check(node, ctx)
        if reason is not None:
            raise InvalidNodeError(reason, node)
        logger.debug("converting %s (%s)", node.name, node.op)
        self.convert(node, ctx)
