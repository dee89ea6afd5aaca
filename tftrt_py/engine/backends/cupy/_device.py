"""Lazy access to cupy, the cuDNN frontend and the GPU.

Nothing here imports cupy or cudnn at module import, so the backend package imports on a
machine without a GPU; :func:`require` raises BackendError with the reason instead.
"""
from __future__ import annotations

import ctypes
import functools
import logging
import threading
from typing import Optional, Tuple

from tftrt_py.engine.errors import BackendError

__all__ = ["UNAVAILABLE", "probe", "require", "cudnn_module", "device_name", "is_out_of_memory", "driver",
           "current_context", "start_driver"]

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


def start_driver() -> bool:
    """Initialize CUDA's driver and retain device 0's primary context, the context cupy's runtime calls on a fresh
    thread use: what the first of them would otherwise do (0.2-0.35 s on an H200 machine) while holding up the
    build. Through ctypes, which calls without the GIL, so that on a thread beside the loading of a model it leaves
    the GIL to that. The context stays retained, as cupy keeps it once it has used it. Whether it was done: where
    it fails (no driver, no device), nothing is held and cupy's own calls say why later."""
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    device, context = ctypes.c_int(), ctypes.c_void_p()
    return (lib.cuInit(0) == 0 and lib.cuDeviceGet(ctypes.byref(device), 0) == 0
            and lib.cuDevicePrimaryCtxRetain(ctypes.byref(context), device) == 0)


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


#: The CUDA driver calls a native replay makes (engine.replay.Functions, in its order).
DRIVER_CALLS = ("cuCtxSetCurrent", "cuMemcpyHtoDAsync_v2", "cuMemcpyDtoHAsync_v2", "cuGraphLaunch",
                "cuStreamSynchronize", "cuMemHostAlloc", "cuMemFreeHost")


@functools.lru_cache(maxsize=None)
def driver() -> Optional[tuple]:
    """(the CUDA driver library, the addresses of DRIVER_CALLS), or None when the driver lacks them (logged)."""
    try:
        lib = ctypes.CDLL("libcuda.so.1")
        return lib, tuple(ctypes.cast(getattr(lib, name), ctypes.c_void_p).value for name in DRIVER_CALLS)
    except (OSError, AttributeError) as exc:
        logger.warning("the CUDA driver's calls for native replays are unavailable (%s): engine ops run through "
                       "Python", exc)
        return None


def current_context() -> int:
    """The calling thread's current CUDA context (0 when none): where cupy's runtime calls on this thread run."""
    found = driver()
    if found is None:
        return 0
    handle = ctypes.c_void_p()
    if found[0].cuCtxGetCurrent(ctypes.byref(handle)) != 0:
        return 0
    return handle.value or 0
