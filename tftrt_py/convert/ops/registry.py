"""The op converter registry: TF op type -> converter. The only list of supported ops.

Importing this module imports its package, tftrt_py.convert.ops, which registers every converter.
"""
from __future__ import annotations

from typing import Dict, List, Optional

from tftrt_py.convert.errors import UnsupportedOpError

__all__ = ["register", "get_converter", "find_converter", "registered_ops"]

_REGISTRY: Dict[str, object] = {}


def register(*op_types: str):
    """Class decorator: one converter instance serves every op type named (duplicates raise)."""

    def wrap(cls):
        instance = cls()
        for op in op_types:
            if op in _REGISTRY:
                raise ValueError(f"op {op!r} already has converter {type(_REGISTRY[op]).__name__}")
            _REGISTRY[op] = instance
        cls.op_types = tuple(op_types)
        return cls

    return wrap


def find_converter(op_type: str) -> Optional[object]:
    return _REGISTRY.get(op_type)


def get_converter(op_type: str):
    conv = find_converter(op_type)
    if conv is None:
        raise UnsupportedOpError(f"No converter for op {op_type}")
    return conv


def registered_ops() -> List[str]:
    return sorted(_REGISTRY)
