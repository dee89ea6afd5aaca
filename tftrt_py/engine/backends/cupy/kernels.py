"""Generated CUDA kernels: source helpers and caches of compiled cupy kernels.

Kernel sources live in this package's ``cuda/`` folder (package data, :func:`source`); each op prepends the
``#define`` lines of its specialization. Raw kernels see float16 as ``unsigned short`` and convert with PTX
``cvt`` (no cuda_fp16.h needed); Elementwise/Reduction kernels use cupy's own float16 type. Every kernel is cached
by its generated source, which holds everything that determines it.
"""
from __future__ import annotations

import concurrent.futures
import functools
import importlib.resources
import logging
import math
import threading
from typing import List

import numpy as np

__all__ = ["source", "raw_kernel", "compile_pending", "elementwise", "reduction", "launch", "flit", "RAW_PRELUDE",
           "raw_type", "STORE_TYPE"]

logger = logging.getLogger(__name__)

#: Threads compile_pending compiles raw kernels in. NVRTC runs without the GIL: on an H200 machine 16 kernels took
#: 0.31 s in 4 threads against 1.07 s one after another, and 8 or 16 threads did no better.
COMPILE_THREADS = 4

#: Raw-kernel storage type per dtype and how to load it as float / store a float.
STORE_TYPE = {"float32": "float", "float16": "unsigned short", "int32": "int", "int8": "signed char",
              "bool": "bool"}

RAW_PRELUDE = r"""
__device__ __forceinline__ float ld(float v) { return v; }
__device__ __forceinline__ float ld(unsigned short h) {
  float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h)); return f;
}
__device__ __forceinline__ float ld(int v) { return (float)v; }
__device__ __forceinline__ float ld(signed char v) { return (float)v; }
template <typename T> __device__ __forceinline__ T st(float f);
template <> __device__ __forceinline__ float st<float>(float f) { return f; }
template <> __device__ __forceinline__ unsigned short st<unsigned short>(float f) {
  unsigned short h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h;
}
template <> __device__ __forceinline__ signed char st<signed char>(float f) { return (signed char)f; }
#define TT_INF __int_as_float(0x7f800000)
"""


@functools.lru_cache(maxsize=None)
def source(name: str) -> str:
    """The CUDA source file `name` of the package's cuda/ folder."""
    return importlib.resources.files(__package__).joinpath("cuda", name).read_text()


def raw_type(dtype: str) -> str:
    return STORE_TYPE[dtype]


def flit(x) -> str:
    """A float literal for generated source (inf and nan included)."""
    x = float(x)
    if math.isnan(x):
        return "__int_as_float(0x7fffffff)"
    if math.isinf(x):
        return "__int_as_float(0x7f800000)" if x > 0 else "__int_as_float(0xff800000)"
    return f"{x!r}f"


_pending: List = []  # raw kernels made since compile_pending last ran
_pending_lock = threading.Lock()


@functools.lru_cache(maxsize=None)
def raw_kernel(source: str, name: str):
    """The raw kernel `name` of `source`, compiled by compile_pending or else at its first launch."""
    import cupy

    kernel = cupy.RawKernel(RAW_PRELUDE + source, name, options=("-std=c++17",))
    with _pending_lock:
        _pending.append(kernel)
    return kernel


def compile_pending() -> None:
    """Compile the raw kernels made since the last call, for the calling thread's device, COMPILE_THREADS at a time.
    cupy compiles a kernel at its first launch, so a fresh program's kernels would compile one after another as it
    first runs; a kernel already compiled (one launched while its layer's tactic was timed) is found in cupy's
    cache. A kernel that fails to compile here is left to fail at its launch, which says why."""
    import cupy

    with _pending_lock:
        todo = list(_pending)
        _pending.clear()
    if len(todo) < 2:
        return  # (one compiles as fast at its launch)
    device = cupy.cuda.Device().id

    def compile_one(kernel) -> None:
        try:
            with cupy.cuda.Device(device):
                kernel.compile()
        except Exception as exc:  # (raised again where the kernel is launched)
            logger.debug("raw kernel %s did not compile ahead: %s", kernel.name, exc)

    with concurrent.futures.ThreadPoolExecutor(min(COMPILE_THREADS, len(todo)),
                                               thread_name_prefix="tftrt-nvrtc") as pool:
        list(pool.map(compile_one, todo))


@functools.lru_cache(maxsize=None)
def elementwise(in_params: str, out_params: str, body: str, name: str, preamble: str = ""):
    import cupy

    return cupy.ElementwiseKernel(in_params, out_params, body, name, preamble=preamble)


@functools.lru_cache(maxsize=None)
def reduction(in_params: str, out_params: str, map_expr: str, reduce_expr: str, post_map_expr: str,
              identity: str, name: str, reduce_type: str, preamble: str = ""):
    import cupy

    return cupy.ReductionKernel(in_params, out_params, map_expr, reduce_expr, post_map_expr, identity, name,
                                reduce_type=reduce_type, preamble=preamble)


def launch(kernel, total: int, args, block: int = 256) -> None:
    """Launch a grid-stride raw kernel over `total` items on the current stream."""
    if total <= 0:
        return
    grid = int(min((total + block - 1) // block, 65535 * 16))
    kernel((grid,), (block,), tuple(args))


def i64(x) -> np.int64:
    return np.int64(x)


def i32(x) -> np.int32:
    return np.int32(x)
