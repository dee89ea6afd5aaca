"""Giving freed memory back to the system between conversion stages.

A conversion frees gigabytes at a time (graphs, functions and engines holding a model's weights), but glibc's
allocator keeps freed heap pages mapped for later use, so the process's resident memory would stay at its peak after
the converter is dropped. :func:`release_freed_memory` asks glibc to return them (``malloc_trim``); elsewhere it does
nothing. Memory TensorFlow's own allocators pool (oneDNN's, when its kernels are on) stays theirs.

A stage of a conversion (:func:`frees_its_memory`) ends with a garbage collection, which frees what the stage left
in reference cycles (TensorFlow's graphs and functions) before the pages go back. A full collection examines every
object the process tracks: with TensorFlow and the GPU libraries imported, over 340,000 of them, 0.2-0.5 s a
collection. The objects alive when the stage begins are set aside meanwhile (``gc.freeze``: no collection examines
them until they are put back when it ends), so that collection examines only what the stage made. What the stage
drops of the older objects is collected by the collections after it, as it would be without the stage, but for a
converter that went before it: a stage after one collects everything.

CPython 3.12 starts with a few hundred of its own objects frozen (``gc.get_freeze_count()`` is 375 in a bare 3.12
interpreter, 0 in 3.11 and 3.13). Objects frozen before this module was imported count as nobody's: a stage sets the
older objects aside all the same, and its unfreeze puts those back with the rest; otherwise every stage on 3.12 would
collect every object (0.25-0.35 s a stage with TensorFlow and the GPU libraries loaded).
"""
from __future__ import annotations

import ctypes
import functools
import gc
import threading

__all__ = ["release_freed_memory", "frees_its_memory", "MemoryReturn"]


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


_freeze_lock = threading.Lock()

#: objects in the permanent generation when this module was imported (the interpreter's own, on CPython 3.12)
_FROZEN_AT_IMPORT = gc.get_freeze_count()


def frees_its_memory(stage):
    """Decorate a conversion stage (a method of the converter): when it returns or raises, what it made and dropped
    is collected and the free pages go back (release_freed_memory), the objects older than the stage set aside
    meanwhile (with those frozen before this module was imported, which are put back with them). After a converter
    went (a MemoryReturn, since the last full collection), the stage collects everything: what that converter held
    in reference cycles is older than the stage (a process converting models one after another frees each one's
    memory in the next one's stages). Where something else froze objects since (a user's ``gc.freeze`` before
    forking, or a stage running in another thread), the stage sets nothing aside of its own: it collects every
    object but those, which stay frozen."""

    @functools.wraps(stage)
    def run(*args, **kwargs):
        with _freeze_lock:
            froze = gc.get_freeze_count() <= _FROZEN_AT_IMPORT
            if froze:
                gc.freeze()
        try:
            return stage(*args, **kwargs)
        finally:
            try:
                if froze and _pending:  # a converter went since the last full collection: its cycles are older
                    gc.unfreeze()
                    froze = False
                release_freed_memory()
            finally:
                if froze:
                    gc.unfreeze()

    return run


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
