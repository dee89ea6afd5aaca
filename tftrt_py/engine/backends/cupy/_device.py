"""Lazy access to cupy, the cuDNN frontend and the GPU.

Nothing here imports cupy or cudnn at module import, so the backend package imports on a
machine without a GPU; :func:`require` raises BackendError with the reason instead.
"""
from __future__ import annotations

import functools
import logging
import threading
from typing import Tuple

from tftrt_py.engine.errors import BackendError

__all__ = ["UNAVAILABLE", "probe", "require", "cudnn_module", "device_name", "is_out_of_memory"]

logger = logging.getLogger(__name__)

UNAVAILABLE = "no NVIDIA GPU / cupy not installed: using the numpy backend"

_lock = threading.Lock()


@functools.lru_cache(maxsize=None)
def probe() -> Tuple[bool, str]:
    """(usable, reason or device name): cupy imports and sees at least one CUDA device."""
    try:
        import cupy
    except Exception as exc:  # ImportError, or a broken CUDA install
        return False, f"{UNAVAILABLE} (import cupy failed: {exc})"
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:
        return False, f"{UNAVAILABLE} ({exc})"
    if count < 1:
        return False, f"{UNAVAILABLE} (no CUDA device visible)"
    return True, device_name()


def require():
    """The cupy module, or BackendError saying why the GPU backend cannot run here."""
    ok, why = probe()
    if not ok:
        raise BackendError(why)
    import cupy

    return cupy


@functools.lru_cache(maxsize=None)
def cudnn_module():
    """The ``cudnn`` module of nvidia-cudnn-frontend, or None (convolutions then use im2col + cuBLAS)."""
    try:
        import cudnn

        cudnn.backend_version()
        return cudnn
    except Exception as exc:
        logger.warning("nvidia-cudnn-frontend is not usable (%s); convolutions run as im2col + cuBLAS GEMMs, "
                       "which is slower: pip install nvidia-cudnn-frontend", exc)
        return None


@functools.lru_cache(maxsize=None)
def device_name() -> str:
    """The current GPU's name and compute capability, e.g. ``NVIDIA H100 80GB HBM3 (sm_90)``."""
    import cupy

    dev = cupy.cuda.Device()
    name = cupy.cuda.runtime.getDeviceProperties(dev.id)["name"]
    if isinstance(name, bytes):
        name = name.decode(errors="replace")
    return f"{name} (sm_{dev.compute_capability})"


def free_and_total() -> Tuple[int, int]:
    import cupy

    return cupy.cuda.runtime.memGetInfo()


def is_out_of_memory(exc: BaseException) -> bool:
    """True for cupy's OutOfMemoryError and CUDA/cuDNN allocation failures."""
    import cupy

    if isinstance(exc, cupy.cuda.memory.OutOfMemoryError):
        return True
    text = str(exc)
    return "cudaErrorMemoryAllocation" in text or "out of memory" in text.lower()
