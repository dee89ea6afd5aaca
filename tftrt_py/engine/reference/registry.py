"""The reference kernels' registry: one function per layer kind, ``fn(layer, inputs) -> outputs``."""
from __future__ import annotations

from typing import Callable, Dict

__all__ = ["KERNELS", "kernel"]

KERNELS: Dict[str, Callable] = {}


def kernel(kind: str):
    """Register the decorated function as the reference kernel of layer `kind`."""
    def wrap(fn):
        KERNELS[kind] = fn
        return fn

    return wrap
