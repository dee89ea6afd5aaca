"""cuBLAS GEMMs through ctypes, so they can be captured in CUDA graphs.

Each execution context owns one handle bound to its stream and to a workspace it provides
(cuBLAS must not allocate while a graph is being captured). All matrices are row-major here;
:meth:`Cublas.gemm` turns a row-major product into cuBLAS's column-major call.
"""
from __future__ import annotations

import ctypes
import functools
import os

from tftrt_py.engine.errors import BackendError

__all__ = ["Cublas", "load"]

_OP_N, _OP_T = 0, 1
#: cudaDataType codes.
_DTYPE = {"float32": 0, "float16": 2, "int8": 3, "int32": 10}
_COMPUTE_32F, _COMPUTE_32F_FAST_TF32, _COMPUTE_32I = 68, 77, 72
_GEMM_DEFAULT = -1
_DEFAULT_MATH = 0


@functools.lru_cache(maxsize=None)
def load() -> ctypes.CDLL:
    """The libcublas cupy already loaded (found in /proc/self/maps), else the first one found."""
    import cupy

    try:
        cupy.cuda.device.get_cublas_handle()
    except Exception:
        pass
    paths = []
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                path = line.split()[-1] if line.strip() else ""
                if os.path.basename(path).startswith("libcublas.so") and path not in paths:
                    paths.append(path)
    except OSError:
        pass
    try:
        from cuda.pathfinder import load_nvidia_dynamic_lib

        paths.append(load_nvidia_dynamic_lib("cublas").abs_path)
    except Exception:
        pass
    paths += ["libcublas.so.13", "libcublas.so.12", "libcublas.so"]
    for path in paths:
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        _declare(lib)
        return lib
    raise BackendError("libcublas was not found (tried cupy's, cuda-pathfinder's and the loader's): install "
                       "the CUDA toolkit or the nvidia-cublas wheel")


def _declare(lib) -> None:
    vp, i, ll = ctypes.c_void_p, ctypes.c_int, ctypes.c_longlong
    lib.cublasCreate_v2.argtypes = [ctypes.POINTER(vp)]
    lib.cublasDestroy_v2.argtypes = [vp]
    lib.cublasSetStream_v2.argtypes = [vp, vp]
    lib.cublasSetWorkspace_v2.argtypes = [vp, vp, ctypes.c_size_t]
    lib.cublasSetMathMode.argtypes = [vp, i]
    lib.cublasGemmStridedBatchedEx.argtypes = [vp, i, i, i, i, i, vp, vp, i, i, ll, vp, i, i, ll, vp, vp, i, i, ll,
                                                i, i, i]
    lib.cublasGemmBatchedEx.argtypes = [vp, i, i, i, i, i, vp, vp, i, i, vp, i, i, vp, vp, i, i, i, i, i]
    for name in ("cublasCreate_v2", "cublasDestroy_v2", "cublasSetStream_v2", "cublasSetWorkspace_v2",
                 "cublasSetMathMode", "cublasGemmStridedBatchedEx", "cublasGemmBatchedEx"):
        getattr(lib, name).restype = ctypes.c_int


def _check(status: int, what: str) -> None:
    if status != 0:
        hint = " (out of memory)" if status == 3 else ""
        raise RuntimeError(f"cuBLAS {what} failed with status {status}{hint}")


class Cublas:
    """One cuBLAS handle on `stream_ptr` with a caller-owned workspace."""

    def __init__(self, stream_ptr: int, workspace_ptr: int, workspace_bytes: int):
        self.lib = load()
        handle = ctypes.c_void_p()
        _check(self.lib.cublasCreate_v2(ctypes.byref(handle)), "create")
        self.handle = handle
        #: The workspace, also lent to the context's cuBLASLt calls (same stream, so never at once).
        self.workspace_ptr, self.workspace_bytes = workspace_ptr, workspace_bytes
        _check(self.lib.cublasSetStream_v2(handle, ctypes.c_void_p(stream_ptr)), "set stream")
        _check(self.lib.cublasSetWorkspace_v2(handle, ctypes.c_void_p(workspace_ptr), workspace_bytes), "set workspace")
        _check(self.lib.cublasSetMathMode(handle, _DEFAULT_MATH), "set math mode")

    def close(self) -> None:
        if self.handle is not None:
            self.lib.cublasDestroy_v2(self.handle)
            self.handle = None

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def gemm(self, dtype: str, m: int, n: int, k: int, a: int, lda: int, trans_a: bool, b: int, ldb: int,
             trans_b: bool, c: int, ldc: int, batch: int = 1, stride_a: int = 0, stride_b: int = 0,
             stride_c: int = 0, allow_tf32: bool = False, out_dtype: str = None, alpha: float = 1.0) -> None:
        """Row-major C[m, n] = alpha op(A) @ op(B) for `batch` matrices; leading dims and strides in elements.

        A is [m, k] (stored [k, m] when `trans_a`), B is [k, n] (stored [n, k] when `trans_b`).
        float16 operands accumulate in float32; float32 uses TF32 only when `allow_tf32`.
        """
        compute, alpha, beta = _scalars(dtype, alpha, allow_tf32)
        t_in, t_out = _DTYPE[dtype], _DTYPE[out_dtype or dtype]
        # Row-major C = A B is column-major C^T = B^T A^T: swap the operands.
        status = self.lib.cublasGemmStridedBatchedEx(
            self.handle, _OP_T if trans_b else _OP_N, _OP_T if trans_a else _OP_N, n, m, k,
            ctypes.byref(alpha), ctypes.c_void_p(b), t_in, ldb, stride_b,
            ctypes.c_void_p(a), t_in, lda, stride_a,
            ctypes.byref(beta), ctypes.c_void_p(c), t_out, ldc, stride_c, batch, compute, _GEMM_DEFAULT)
        _check(status, f"gemm ({dtype}, m={m} n={n} k={k} batch={batch})")

    def gemm_batched(self, dtype: str, m: int, n: int, k: int, a_ptrs: int, lda: int, trans_a: bool, b_ptrs: int,
                     ldb: int, trans_b: bool, c_ptrs: int, ldc: int, batch: int, allow_tf32: bool = False,
                     out_dtype: str = None, alpha: float = 1.0) -> None:
        """As :meth:`gemm`, for `batch` matrices anywhere: `*_ptrs` are device arrays of their addresses."""
        compute, alpha, beta = _scalars(dtype, alpha, allow_tf32)
        t_in, t_out = _DTYPE[dtype], _DTYPE[out_dtype or dtype]
        status = self.lib.cublasGemmBatchedEx(
            self.handle, _OP_T if trans_b else _OP_N, _OP_T if trans_a else _OP_N, n, m, k,
            ctypes.byref(alpha), ctypes.c_void_p(b_ptrs), t_in, ldb, ctypes.c_void_p(a_ptrs), t_in, lda,
            ctypes.byref(beta), ctypes.c_void_p(c_ptrs), t_out, ldc, batch, compute, _GEMM_DEFAULT)
        _check(status, f"batched gemm ({dtype}, m={m} n={n} k={k} batch={batch})")


def _scalars(dtype: str, alpha: float, allow_tf32: bool):
    """(compute type, alpha, beta) of a GEMM on `dtype` operands."""
    if dtype == "int8":
        return _COMPUTE_32I, ctypes.c_int32(int(alpha)), ctypes.c_int32(0)
    compute = _COMPUTE_32F_FAST_TF32 if (allow_tf32 and dtype == "float32") else _COMPUTE_32F
    return compute, ctypes.c_float(alpha), ctypes.c_float(0.0)
