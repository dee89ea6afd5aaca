"""Conversion errors: one family, each with a code, naming the node and op where there is one."""

__all__ = ["ConversionError", "UnsupportedOpError", "InvalidNodeError"]


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
