"""INT8 calibration's statistics of a tensor on the GPU (Backend.finite_abs_max, Backend.bin_counts): two raw kernels
of one source (cuda/histogram.cu), compiled once per machine. The same arithmetic written with cupy's ufuncs
(abs, multiply, minimum, a cast, bincount, min and max) compiles about seven kernels on a fresh machine, seconds
beside a conversion's other compiles, and bincount's global counters serialize on the zeros a ReLU leaves.
"""
from __future__ import annotations

import functools

import numpy as np

from tftrt_py.engine.backends.cupy import _device
from tftrt_py.engine.backends.cupy.kernels import raw_kernel, source

__all__ = ["finite_abs_max", "bin_counts"]

BLOCK = 256
#: The bits of -1.0f: where no value is finite, tt_finite_abs_max leaves it.
NONE_FINITE = np.array([-1.0], np.float32).view(np.int32)


@functools.lru_cache(maxsize=None)
def _blocks() -> int:
    """Blocks of one launch at most: two per multiprocessor (a block adds its bins to the global counts once)."""
    return 2 * _device.require().cuda.Device().attributes["MultiProcessorCount"]


def _floats(array):
    cupy = _device.require()
    return cupy.ascontiguousarray(cupy.asarray(array), dtype=cupy.float32).reshape(-1)


def finite_abs_max(array) -> float:
    """The largest |value| among the finite values of `array` (a device or host array); -1.0 when none is."""
    cupy = _device.require()
    x = _floats(array)
    out = cupy.asarray(NONE_FINITE)  # a copy, no kernel
    if x.size:
        kernel = raw_kernel(source("histogram.cu"), "tt_finite_abs_max")
        kernel((min(_blocks() * 4, -(-x.size // BLOCK)),), (BLOCK,), (x, np.int64(x.size), out))
    return float(out.get().view(np.float32)[0])


def bin_counts(array, scale: np.float32, bins: int) -> np.ndarray:
    """int64 counts of the finite values of `array` in `bins` bins: x in bin min(|x| * scale, bins - 1), truncated,
    in float32."""
    cupy = _device.require()
    x = _floats(array)
    counts = cupy.zeros(bins, cupy.uint64)  # a memset, no kernel
    if x.size:
        kernel = raw_kernel(source("histogram.cu"), "tt_bin_counts")
        kernel((min(_blocks(), -(-x.size // BLOCK)),), (BLOCK,), (x, np.int64(x.size), np.float32(scale),
                                                               np.int32(bins), counts), shared_mem=4 * bins)
    return counts.get().astype(np.int64)
