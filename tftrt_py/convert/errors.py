"""Conversion errors: one family, each with a code, naming the node and op where there is one."""
from tftrt_py.engine.errors import BuildError

__all__ = ["ConversionError", "UnsupportedOpError", "InvalidNodeError", "MissingQuantizationRangeError",
           "AlreadyConvertedError"]


class ConversionError(Exception):
    code = "CONVERSION_FAILED"

    def __init__(self, message: str, node=None):
        where = f"{node.op} node {node.name!r}: " if node is not None else ""
        super().__init__(where + message)
        self.node = node


class UnsupportedOpError(ConversionError):
    code = "UNSUPPORTED_OP"


class InvalidNodeError(ConversionError):
    code = "INVALID_NODE"


class MissingQuantizationRangeError(ConversionError, BuildError):
    """INT8: tensors that int8 layers read have no quantization range (`tensors` names them). Also a
    BuildError, so engine ops treat it as any failed build (native fallback, logged)."""

    code = "MISSING_QUANTIZATION_RANGE"

    def __init__(self, message: str, tensors=(), node=None):
        super().__init__(message, node)
        self.tensors = list(tensors)


class AlreadyConvertedError(ConversionError, RuntimeError):
    """convert() called a second time: a converter converts once (TF-TRT asserts it)."""

    code = "ALREADY_CONVERTED"

    def __init__(self, converter):
        name = type(converter).__name__
        super().__init__(f"convert() was already called on this {name}; a converter converts once: make a new "
                         f"{name} to convert again")
