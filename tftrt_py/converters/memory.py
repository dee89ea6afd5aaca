"""Giving freed memory back to the system between conversion stages.

A conversion frees gigabytes at a time (graphs, functions and engines holding a model's weights), but glibc's
allocator keeps freed heap pages mapped for later use, so the process's resident memory would stay at its peak after
the converter is dropped. :func:`release_freed_memory` asks glibc to return them (``malloc_trim``); elsewhere it does
nothing. Memory TensorFlow's own allocators pool (oneDNN's, when its kernels are on) stays theirs.
"""
from __future__ import annotations

import ctypes
import functools
import gc

__all__ = ["release_freed_memory", "MemoryReturn"]


@functools.lru_cache(maxsize=None)
def _malloc_trim():
    # the process's own symbols, libc's among them: no library search (which imports modules, and a MemoryReturn
    # may go while the interpreter shuts down, when imports fail)
    try:
        return ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):  # not glibc
        return None


def _trim() -> None:
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


def release_freed_memory() -> None:
    """Collect garbage, then give the allocator's free pages back to the system (glibc only)."""
    gc.collect()
    _trim()


_pending = False


def _after_collection(phase: str, info: dict) -> None:
    """gc callback: after the first full collection since a MemoryReturn went, give the pages back (what its
    owner held in reference cycles, TensorFlow's functions and graphs, is freed by that collection)."""
    global _pending
    if _pending and phase == "stop" and info.get("generation") == 2:
        _pending = False
        _trim()


class MemoryReturn:
    """Gives freed memory back when it goes: an object's last attribute holding one does so once the object's
    other attributes (made before it) are freed, and again after the next full garbage collection."""

    def __del__(self):
        global _pending
        _trim()
        _pending = True
        if _after_collection not in gc.callbacks:
            gc.callbacks.append(_after_collection)
