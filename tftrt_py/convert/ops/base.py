"""The op converter base: shared checks, then ``validate``, then ``convert``.

A converter declares ``allowed_dtypes`` (checked on ``dtype_attr``) and an input spec
(``WEIGHT`` for inputs that must be constants, else ``ANY``;
the last entry repeats). ``validate(node,
ctx)`` returns None or a reason; it never leaves state for ``convert`` to read.
"""
from __future__ import annotations

from typing import Optional, Sequence

from tftrt_py.convert.errors import InvalidNodeError

__all__ = ["OpConverter", "WEIGHT", "ANY", "FLOAT", "FLOAT_INT", "FLOAT_INT_BOOL"]

WEIGHT, ANY = "weight", "any"

#: dtype policies, stated once and named by converters.
FLOAT = ("float32", "float16")
FLOAT_INT = ("float32", "float16", "int32")
FLOAT_INT_BOOL = ("float32", "float16", "int32", "bool")


class OpConverter:
    allowed_dtypes: Sequence[str] = FLOAT
    dtype_attr: Optional[str] = "T"
    input_spec: Sequence[str] = (ANY,)

    def validate(self, node, ctx) -> Optional[str]:
        """Op-specific checks (attributes, shapes). None when the node can convert."""
        return None

    def convert(self, node, ctx) -> None:
        raise NotImplementedError

    def check(self, node, ctx) -> Optional[str]:
        """Shared checks then :meth:`validate`; the reason the node cannot convert, or None."""
        if self.dtype_attr is not None:
            dtype = node.attr(self.dtype_attr)
            if dtype is not None and dtype not in self.allowed_dtypes:
                return f"{node.op} with {self.dtype_attr}={dtype} is not supported (supported: {', '.join(self.allowed_dtypes)})"
        infos = ctx.input_infos(node)
        for i, info in enumerate(infos):
            kind = self.input_spec[min(i, len(self.input_spec) - 1)]
            if kind == WEIGHT and info.value is None:
                return f"input {i} of {node.op} must be a constant"
        return self.validate(node, ctx)

    def __call__(self, node, ctx) -> None:
        reason = self.check(node, ctx)
        if reason is not None:
            raise InvalidNodeError(reason, node)
        self.convert(node, ctx)
