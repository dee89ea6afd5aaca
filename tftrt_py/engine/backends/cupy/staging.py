"""Host <-> device copies through a context's pinned buffers, in chunks that overlap.

A host array reaches the device in two steps: a CPU copy into pinned memory (what lets the DMA run
asynchronously at full bus speed; a DMA from pageable memory goes through the driver's own staging at a
fraction of it) and the DMA itself. Large arrays go in chunks: worker threads copy the next chunks while
the DMA of the first runs, so a transfer costs about the slower of the two steps, not their sum. numpy
releases the GIL while it copies, so the workers copy in parallel (``TFTRT_PY_COPY_THREADS``, default 4;
1 copies on the calling thread).
"""
from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Optional, Tuple

import numpy as np

__all__ = ["to_device", "from_pinned", "copy"]

#: Arrays up to this size are copied in one piece; larger ones in chunks of this size.
CHUNK_BYTES = 2 << 20
THREADS_ENV = "TFTRT_PY_COPY_THREADS"

_pool: Optional[ThreadPoolExecutor] = None
_pool_lock = threading.Lock()


def _workers() -> Optional[ThreadPoolExecutor]:
    global _pool
    with _pool_lock:
        if _pool is None:
            threads = max(1, int(os.environ.get(THREADS_ENV, "4")))
            _pool = ThreadPoolExecutor(threads, thread_name_prefix="tftrt_py-copy") if threads > 1 else False
        return _pool or None


def _chunks(a: np.ndarray, b, nbytes: int):
    """Flat views of `a` and `b` (same size) cut into chunks of about `nbytes`: [(a part, b part), ...]."""
    fa, fb = a.reshape(-1), b.reshape(-1)
    step = max(1, nbytes // max(fa.itemsize, 1))
    return [(fa[i:i + step], fb[i:i + step]) for i in range(0, fa.size, step)]


def to_device(src: np.ndarray, pinned: np.ndarray, device, stream) -> None:
    """Copy host `src` into `device` (a cupy array of its shape) through `pinned`, asynchronously on `stream`:
    the DMAs are queued when this returns; `pinned` must not be reused before the stream passes them."""
    src = np.ascontiguousarray(src)
    pool = _workers()
    if src.nbytes <= CHUNK_BYTES or pool is None:
        np.copyto(pinned, src, casting="no")
        device.set(pinned, stream=stream)
        return
    parts = _chunks(pinned, src, CHUNK_BYTES)
    futures = [pool.submit(np.copyto, dst, part, casting="no") for dst, part in parts]
    for (dst, _), future, (dev, _) in zip(parts, futures, _chunks(device, pinned, CHUNK_BYTES)):
        future.result()
        dev.set(dst, stream=stream)


def copy(dst: np.ndarray, src: np.ndarray) -> None:
    """``np.copyto(dst, src)`` (cast as needed), split across the copy workers when large."""
    pool = _workers()
    if src.nbytes <= CHUNK_BYTES or pool is None or not (dst.flags.c_contiguous and src.flags.c_contiguous):
        np.copyto(dst, src, casting="unsafe")
        return
    for future in [pool.submit(np.copyto, d, s, casting="unsafe") for d, s in _chunks(dst, src, CHUNK_BYTES)]:
        future.result()


def from_pinned(out: np.ndarray, index: int,
                outputs: Optional[Callable[[int, Tuple[int, ...]], np.ndarray]]) -> np.ndarray:
    """Output `index`, read back into pinned `out`, copied into ``outputs(index, shape)`` (the caller's buffer)
    or else into a new array (the pinned buffer is reused by the next run)."""
    dst = np.empty(out.shape, out.dtype) if outputs is None else outputs(index, out.shape)
    copy(dst, out)
    return dst
