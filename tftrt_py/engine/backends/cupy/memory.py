"""Counting allocation: every device buffer the backend takes is charged to an engine's ledger.

Weights (uploaded once per engine, shared by its contexts), activations (each context's arena),
workspace (each context's scratch for cuDNN plans, cuBLAS and im2col) and io (each context's
binding buffers). Running out of GPU memory raises an error naming what was being allocated.
"""
from __future__ import annotations

import threading
from typing import Dict

from tftrt_py.engine.backends.cupy import _device

__all__ = ["KINDS", "Ledger", "OutOfGpuMemory"]

KINDS = ("weights", "activations", "workspace", "io")


class OutOfGpuMemory(Exception):
    """Allocation failed; the message names the engine, the purpose and the engine's holdings."""


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB"


class Ledger:
    """Bytes held by one engine, by kind; ``alloc`` charges, ``release`` refunds."""

    def __init__(self, engine_name: str):
        self.engine_name = engine_name
        self._lock = threading.Lock()
        self.bytes: Dict[str, int] = dict.fromkeys(KINDS, 0)
        self.peak = 0

    def alloc(self, kind: str, nbytes: int):
        """A cupy MemoryPointer of at least `nbytes` (>= 1), charged to `kind`."""
        cupy = _device.require()
        nbytes = int(nbytes)
        try:
            mem = cupy.get_default_memory_pool().malloc(max(nbytes, 1))
        except Exception as exc:
            if _device.is_out_of_memory(exc):
                raise self.out_of_memory(kind, nbytes) from exc
            raise
        self.charge(kind, nbytes)
        return mem

    def charge(self, kind: str, nbytes: int) -> None:
        with self._lock:
            self.bytes[kind] += int(nbytes)
            self.peak = max(self.peak, sum(self.bytes.values()))

    def release(self, kind: str, nbytes: int) -> None:
        with self._lock:
            self.bytes[kind] -= int(nbytes)

    def report(self) -> Dict[str, int]:
        with self._lock:
            return dict(self.bytes, total=sum(self.bytes.values()), peak=self.peak)

    def out_of_memory(self, kind: str, nbytes: int) -> OutOfGpuMemory:
        try:
            free, total = _device.free_and_total()
            device = f"; the GPU has {_mib(free)} free of {_mib(total)}"
        except Exception:
            device = ""
        held = ", ".join(f"{k} {_mib(v)}" for k, v in self.report().items() if k in KINDS)
        return OutOfGpuMemory(f"out of GPU memory allocating {_mib(nbytes)} of {kind} for engine "
                              f"{self.engine_name!r} (it holds {held}{device}): lower the batch size or "
                              f"max_workspace_size, or use fewer execution contexts")
