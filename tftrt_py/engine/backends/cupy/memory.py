"""Counting allocation: every device buffer the backend takes is charged to an engine's ledger.

Weights (uploaded once per engine, shared by its contexts), activations (each context's arena),
workspace (each context's scratch for cuDNN plans, cuBLAS and im2col) and io (each context's
binding buffers). Every ledger also charges the process's :class:`Budget`
(``TFTRT_PY_GPU_MEMORY_BUDGET``), so engine ops together stay within it; a ledger that goes
returns what it still holds. Running out of GPU memory, or of the budget, raises an error naming
what was being allocated.
"""
from __future__ import annotations

import re
import threading
import weakref
from fractions import Fraction
from typing import Dict, Optional

from tftrt_py import settings
from tftrt_py.engine.backends.cupy import _device

__all__ = ["KINDS", "BUDGET_ENV", "Budget", "Ledger", "OutOfGpuMemory", "parse_bytes", "process_budget"]

KINDS = ("weights", "activations", "workspace", "io")

#: The device bytes engine ops of this process may hold together: bytes, or a size such as 512MiB or 4GiB.
BUDGET_ENV = settings.GPU_MEMORY_BUDGET.name

_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40}


class OutOfGpuMemory(Exception):
    """Allocation failed; the message names the engine, the purpose and the engine's holdings."""


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB"


def parse_bytes(text: str) -> int:
    """A positive size: bytes (``1073741824``) or a number with a unit (``512MiB``, ``4GiB``, ``1.5GB``)."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([A-Za-z]*)\s*", text)
    unit = match.group(2).lower() if match else None
    size = int(Fraction(match.group(1)) * _UNITS[unit]) if unit in _UNITS else 0
    if size <= 0:
        raise ValueError(f"{BUDGET_ENV}={text!r} is not a size: give bytes (1073741824) or a number with a unit "
                         "(KiB, MiB, GiB, TiB or kB, MB, GB, TB), e.g. 512MiB or 4GiB")
    return size


class Budget:
    """Device bytes that engine ops of this process may hold together; ``limit`` None: no limit.

    ``charge`` refuses (OutOfGpuMemory) what would pass the limit; ``refund`` gives bytes back.
    """

    def __init__(self, limit: Optional[int] = None, setting: str = ""):
        self.limit = limit
        self.setting = setting or (str(limit) if limit is not None else "")
        self._lock = threading.Lock()
        self.held = 0
        self.peak = 0

    @classmethod
    def from_setting(cls, text: Optional[str]) -> "Budget":
        """The budget BUDGET_ENV's text sets (None or blank: no limit); a malformed size raises ValueError."""
        setting = (text or "").strip()
        return cls(parse_bytes(setting) if setting else None, setting)

    def charge(self, nbytes: int, what: str) -> None:
        """Count `nbytes` more for `what` (named in the error when the budget cannot hold them)."""
        with self._lock:
            if self.limit is not None and self.held + nbytes > self.limit:
                raise OutOfGpuMemory(
                    f"the GPU memory budget of engine ops cannot hold {_mib(nbytes)} more for {what}: engines "
                    f"hold {_mib(self.held)} of the {_mib(self.limit)} set by {BUDGET_ENV}={self.setting}; raise "
                    f"{BUDGET_ENV}, lower the batch size or max_workspace_size, or cache fewer engines "
                    f"(maximum_cached_engines)")
            self.held += nbytes
            self.peak = max(self.peak, self.held)

    def refund(self, nbytes: int) -> None:
        with self._lock:
            self.held -= nbytes


_process_lock = threading.Lock()
_process: Optional[Budget] = None


def process_budget() -> Budget:
    """The budget all ledgers of this process share, read from BUDGET_ENV on first use."""
    global _process
    with _process_lock:
        if _process is None:
            _process = Budget.from_setting(settings.GPU_MEMORY_BUDGET.raw())
        return _process


class Ledger:
    """Bytes held by one engine, by kind; ``alloc`` charges, ``release`` refunds (here and in `budget`)."""

    def __init__(self, engine_name: str, budget: Optional[Budget] = None):
        self.engine_name = engine_name
        self.budget = budget if budget is not None else process_budget()
        self._lock = threading.Lock()
        self.bytes: Dict[str, int] = dict.fromkeys(KINDS, 0)
        self.peak = 0
        weakref.finalize(self, _return_holdings, self.budget, self.bytes)

    def alloc(self, kind: str, nbytes: int):
        """A cupy MemoryPointer of ``max(nbytes, 1)`` bytes, charged to `kind` (before it is allocated)."""
        cupy = _device.require()
        nbytes = max(int(nbytes), 1)
        self.charge(kind, nbytes)
        try:
            return cupy.get_default_memory_pool().malloc(nbytes)
        except Exception as exc:
            self.release(kind, nbytes)
            if _device.is_out_of_memory(exc):
                raise self.out_of_memory(kind, nbytes) from exc
            raise

    def charge(self, kind: str, nbytes: int) -> None:
        nbytes = int(nbytes)
        self.budget.charge(nbytes, f"{kind} of engine {self.engine_name!r}")
        with self._lock:
            self.bytes[kind] += nbytes
            self.peak = max(self.peak, sum(self.bytes.values()))

    def release(self, kind: str, nbytes: int) -> None:
        nbytes = int(nbytes)
        with self._lock:
            self.bytes[kind] -= nbytes
        self.budget.refund(nbytes)

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


def _return_holdings(budget: Budget, held: Dict[str, int]) -> None:
    """A ledger went: what it still held (its engine's weights, at least) goes back to the budget."""
    budget.refund(sum(held.values()))
