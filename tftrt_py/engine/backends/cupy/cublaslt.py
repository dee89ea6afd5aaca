"""cuBLASLt GEMMs with fused epilogues (bias, tanh GELU, and in fp16 the erf GELU in the tanh form), int8 products
and FP8 (E4M3) products, through nvmath-python's cuBLASLt bindings (``nvmath.bindings.cublasLt``: NVIDIA's
maintained bindings and enums; imported lazily, so this module imports without a GPU).

Why the bindings and not ``nvmath.linalg.advanced.Matmul.execute``: execute allocates its result on every
call (or, in place, needs ``reset_operands`` first), keeps one workspace per Matmul object and holds the
operands as its own state; our ops are shared by every execution context, each with its own stream and
workspace, writing into buffers that CUDA graphs captured; and FP8 operands need a float8 array type, which
cupy lacks. So a :class:`LtGemm` holds only what is fixed once planned (the matmul descriptor with its
epilogue, bias and scale pointers, the layouts, the heuristics' algorithms) and :meth:`LtGemm.run` hands the
caller's pointers, workspace and stream to cublasLtMatmul: nothing is allocated or synchronised, so it can
be captured. Everything here is row-major, mapped onto cuBLASLt's column-major call as in cublas.py.
"""
from __future__ import annotations

import functools
import threading
import types
from typing import Dict, Optional, Tuple

import numpy as np

from tftrt_py.engine.errors import BackendError

__all__ = ["LtGemm", "available", "fused_epilogue", "fp8_gemm", "MIN_ALIGNMENT", "REDUCED_GELU"]

#: Every operand's address must be a multiple of this (plans are made for it, so views into buffers work).
MIN_ALIGNMENT = 16

#: (has bias, activation type) -> cuBLASLt epilogue. cuBLASLt's GELU is the tanh form: erf GELU is not fused in
#: FP32 (see REDUCED_GELU); nor is ReLU: cuBLASLt's turns NaN into 0, where TF (and our epilogue kernel) keeps NaN.
_EPILOGUES: Dict[Tuple[bool, Optional[str]], str] = {
    (False, None): "DEFAULT", (True, None): "BIAS", (False, "gelu_tanh"): "GELU", (True, "gelu_tanh"): "GELU_BIAS"}

#: Activations a GEMM computing in fp16 may fuse as another form: the erf GELU as cuBLASLt's tanh form, as
#: TensorRT's GELU plugin computes BERT's erf GELU. The two differ by at most 4.7e-4 (at |x| = 2.70) and by 1.8e-4
#: relative L2 over N(0, 1.5) inputs, less than rounding the result to fp16 (2.1e-4); FP32 GEMMs keep the erf form.
REDUCED_GELU = {"gelu_erf": "gelu_tanh"}

#: storage dtype -> cudaDataType name (FP8 operands are uint8 arrays of E4M3 bytes).
_DTYPES = {"float32": "CUDA_R_32F", "float16": "CUDA_R_16F", "int8": "CUDA_R_8I", "int32": "CUDA_R_32I",
           "float8_e4m3": "CUDA_R_8F_E4M3"}


def fused_epilogue(has_bias: bool, activation: Optional[dict], dtype: str = "float32") -> Optional[str]:
    """The cuBLASLt epilogue that adds this bias and applies this activation in a GEMM writing `dtype`, or None
    (not fusable)."""
    kind = (activation or {}).get("type")
    if dtype == "float16":
        kind = REDUCED_GELU.get(kind, kind)
    return _EPILOGUES.get((bool(has_bias), kind))


@functools.lru_cache(maxsize=None)
def _nvmath() -> types.SimpleNamespace:
    try:
        from nvmath import CudaDataType
        from nvmath.bindings import cublas, cublasLt
    except Exception as exc:  # ImportError, or no CUDA libraries
        raise BackendError(f"cuBLASLt GEMMs need nvmath-python ({exc}): pip install nvmath-python") from exc
    return types.SimpleNamespace(lt=cublasLt, compute=cublas.ComputeType, dtype=CudaDataType)


def available() -> bool:
    try:
        _nvmath()
        return True
    except BackendError:
        return False


@functools.lru_cache(maxsize=None)
def _handle(device: int) -> int:
    """One cuBLASLt handle per device: cuBLASLt handles may be shared by threads (stream and workspace are
    per call)."""
    return _nvmath().lt.create()


#: The heuristics' algorithms by everything a GEMM's query depends on (its operands' addresses aside): a transformer's
#: layers repeat the same few GEMMs (keras-hub BERT-base's twelve: the fused QKV, the output projection and the MLP's
#: two), and rebuilding its recorded tactics spent 0.2 s in queries on an H200 machine. The algorithms are data, read
#: by every plan of the same GEMM.
_HEURISTICS: Dict[tuple, Tuple[object, int]] = {}
_HEURISTICS_LOCK = threading.Lock()


def _set(lt, kind: str, obj: int, attr, value) -> None:
    """Set a descriptor, layout or preference attribute (`kind`: matmul_desc, matrix_layout, matmul_preference)."""
    dtype_of = {"matmul_desc": lt.get_matmul_desc_attribute_dtype,
                "matrix_layout": lt.get_matrix_layout_attribute_dtype,
                "matmul_preference": lt.get_matmul_preference_attribute_dtype}[kind]
    buf = np.array(value, dtype=dtype_of(attr))
    getattr(lt, f"{kind}_set_attribute")(obj, attr, buf.ctypes.data, buf.nbytes)


class LtGemm:
    """A planned row-major product D[b][m, n] = epilogue(alpha * op(A[b]) @ op(B[b])) for `batch` matrices,
    shared by execution contexts: A is [m, k] (stored [k, m] when `trans_a`), B is [k, n] (stored [n, k]
    when `trans_b`); leading dims and batch strides in elements (a stride of 0 broadcasts).

    `dtype` of A and B: float16/float32 (fp32 accumulation; TF32 only with `allow_tf32`), int8 (int32
    accumulation; A stored [m, k] and B [n, k]: cuBLASLt's int8 kernels want both K-contiguous) or float8_e4m3
    (fp32 accumulation, per-tensor `scales` (device float32 addresses of s_a, s_b), B stored [n, k]).
    `bias`: a device array [n] of the output's dtype, kept referenced here; `epilogue` a name from
    :func:`fused_epilogue`. `residual`: D = AB + C (beta 1, C laid out as D) with C given to :meth:`run`,
    before the epilogue's bias and activation. `algos` algorithms are kept, in the heuristics' order.
    """

    def __init__(self, m: int, n: int, k: int, dtype: str, *, out_dtype: Optional[str] = None, trans_a: bool = False,
                 trans_b: bool = False, lda: Optional[int] = None, ldb: Optional[int] = None,
                 ldd: Optional[int] = None, batch: int = 1, stride_a: int = 0, stride_b: int = 0,
                 stride_d: Optional[int] = None, epilogue: str = "DEFAULT", bias=None, residual: bool = False,
                 allow_tf32: bool = False,
                 scales: Optional[Tuple[int, int]] = None, alpha: float = 1.0, max_workspace: int = 32 << 20,
                 algos: int = 4):
        import cupy

        nv = _nvmath()
        lt = nv.lt
        out_dtype = out_dtype or dtype
        self.m, self.n, self.k, self.dtype, self.out_dtype, self.epilogue = m, n, k, dtype, out_dtype, epilogue
        self.bias, self.residual = bias, bool(residual)
        lda = lda or (m if trans_a else k)
        ldb = ldb or (k if trans_b else n)
        ldd = ldd or n
        if dtype == "int8":
            compute, scale = nv.compute.COMPUTE_32I, nv.dtype.CUDA_R_32I
            self._alpha, self._beta = np.array([int(alpha)], np.int32), np.zeros(1, np.int32)
        else:
            tf32 = allow_tf32 and dtype == "float32"
            compute = nv.compute.COMPUTE_32F_FAST_TF32 if tf32 else nv.compute.COMPUTE_32F
            scale = nv.dtype.CUDA_R_32F
            self._alpha, self._beta = np.array([alpha], np.float32), np.array([float(self.residual)], np.float32)
        if residual and dtype not in ("float16", "float32"):
            raise ValueError(f"a residual (C operand) is for float16/float32 GEMMs, not {dtype}")
        if dtype in ("int8", "float8_e4m3") and (trans_a or not trans_b):
            raise ValueError(f"{dtype} GEMMs take A as [m, k] and B as [n, k] (both K-contiguous)")
        t_in, t_out = getattr(nv.dtype, _DTYPES[dtype]), getattr(nv.dtype, _DTYPES[out_dtype])
        a_ = lt.MatmulDescAttribute
        self.desc = lt.matmul_desc_create(compute, scale)
        self._layouts = []
        self.pref = None
        try:
            # Row-major D = A B is column-major D^T = B^T A^T: cuBLASLt's A is our B and its B our A.
            _set(lt, "matmul_desc", self.desc, a_.TRANSA, 1 if trans_b else 0)
            _set(lt, "matmul_desc", self.desc, a_.TRANSB, 1 if trans_a else 0)
            _set(lt, "matmul_desc", self.desc, a_.EPILOGUE, int(getattr(lt.Epilogue, epilogue)))
            if bias is not None:
                _set(lt, "matmul_desc", self.desc, a_.BIAS_POINTER, int(bias.data.ptr))
                _set(lt, "matmul_desc", self.desc, a_.BIAS_DATA_TYPE, int(t_out))
            if scales is not None:
                _set(lt, "matmul_desc", self.desc, a_.A_SCALE_POINTER, int(scales[1]))
                _set(lt, "matmul_desc", self.desc, a_.B_SCALE_POINTER, int(scales[0]))
            lt_a = (k, n, ldb) if trans_b else (n, k, ldb)
            lt_b = (m, k, lda) if trans_a else (k, m, lda)
            stride_d = m * ldd if stride_d is None else stride_d
            self.a_layout = self._layout(t_in, *lt_a, batch, stride_b)
            self.b_layout = self._layout(t_in, *lt_b, batch, stride_a)
            self.d_layout = self._layout(t_out, n, m, ldd, batch, stride_d)
            # FP8 products read no C here, but cuBLASLt wants it typed as D (fp16/fp32): the D layout serves.
            self.pref = lt.matmul_preference_create()
            p_ = lt.MatmulPreferenceAttribute
            _set(lt, "matmul_preference", self.pref, p_.MAX_WORKSPACE_BYTES, int(max_workspace))
            for attr in (p_.MIN_ALIGNMENT_A_BYTES, p_.MIN_ALIGNMENT_B_BYTES, p_.MIN_ALIGNMENT_C_BYTES,
                         p_.MIN_ALIGNMENT_D_BYTES):
                _set(lt, "matmul_preference", self.pref, attr, MIN_ALIGNMENT)
            device = cupy.cuda.runtime.getDevice()
            self.handle = _handle(device)
            query = (device, m, n, k, dtype, out_dtype, trans_a, trans_b, lda, ldb, ldd, batch, stride_a, stride_b,
                     stride_d, epilogue, bias is not None, self.residual, allow_tf32, scales is not None,
                     max_workspace, algos)
            with _HEURISTICS_LOCK:
                results, count = _HEURISTICS.get(query, (None, 0))
            if results is None:
                results, found = lt.MatmulHeuristicResult(algos), np.zeros(1, np.int32)
                lt.matmul_algo_get_heuristic(self.handle, self.desc, self.a_layout, self.b_layout, self.d_layout,
                                             self.d_layout, self.pref, algos, results.ptr, found.ctypes.data)
                count = int(found[0])
                if count:
                    with _HEURISTICS_LOCK:
                        _HEURISTICS[query] = (results, count)
        except BaseException:
            self.close()
            raise
        if count == 0:
            self.close()
            raise BackendError(f"cuBLASLt has no algorithm for this GEMM ({dtype} -> {out_dtype}, m={m} n={n} "
                               f"k={k} batch={batch}, epilogue {epilogue})")
        self._results = results[:count]
        sizes = np.asarray(self._results["workspace_size"]).reshape(-1)
        #: (algorithm struct, workspace bytes) in the heuristics' order.
        self.algos = [(self._results[i]["algo"], int(sizes[i])) for i in range(count)]

    def _layout(self, dtype, rows, cols, ld, batch, stride) -> int:
        lt = _nvmath().lt
        layout = lt.matrix_layout_create(dtype, rows, cols, ld)
        self._layouts.append(layout)
        if batch > 1:
            _set(lt, "matrix_layout", layout, lt.MatrixLayoutAttribute.BATCH_COUNT, int(batch))
            _set(lt, "matrix_layout", layout, lt.MatrixLayoutAttribute.STRIDED_BATCH_OFFSET, int(stride))
        return layout

    def workspace(self, algo: int) -> int:
        """Workspace bytes algorithm `algo` needs."""
        return self.algos[algo][1]

    def run(self, algo: int, a: int, b: int, d: int, workspace: int, workspace_bytes: int, stream: int,
            c: Optional[int] = None) -> None:
        """Enqueue algorithm `algo` on `stream`: addresses of A, B and D (and C, the residual, when the plan
        has one), and the caller's workspace."""
        if self.residual != (c is not None):
            raise BackendError("a residual GEMM plan runs with a C operand, the others without")
        c = d if c is None else c
        if (a | b | c | d) % MIN_ALIGNMENT:
            raise BackendError(f"cuBLASLt operands must be {MIN_ALIGNMENT}-byte aligned")
        struct, need = self.algos[algo]
        if need > workspace_bytes:
            raise BackendError(f"cuBLASLt algorithm {algo} needs {need} workspace bytes, {workspace_bytes} given")
        _nvmath().lt.matmul(self.handle, self.desc, self._alpha.ctypes.data, b, self.a_layout, a, self.b_layout,
                            self._beta.ctypes.data, c, self.d_layout, d, self.d_layout, struct.ctypes.data,
                            workspace, workspace_bytes, stream)

    def close(self) -> None:
        lt = _nvmath().lt
        for layout in self._layouts:
            lt.matrix_layout_destroy(layout)
        self._layouts = []
        if self.pref is not None:
            lt.matmul_preference_destroy(self.pref)
            self.pref = None
        if self.desc is not None:
            lt.matmul_desc_destroy(self.desc)
            self.desc = None

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


_FP8_PLANS: Dict[tuple, LtGemm] = {}
_FP8_LOCK = threading.Lock()


def fp8_gemm(a, b_nk, scale_a, scale_b, out_dtype: str = "float16", bias=None, out=None, workspace=None,
             stream=None):
    """out[m, n] = (s_a A[m, k]) @ (s_b B[n, k])^T (+ bias[n]) with E4M3 operands, fp32 accumulation.

    `a`, `b_nk`: C-contiguous cupy uint8 arrays of E4M3 bytes; `scale_a`, `scale_b`: cupy float32 arrays of
    one element (per-tensor scales, read on the device); `out_dtype` float16 or float32; `bias`: cupy float16
    array [n], with a float16 output only (cuBLASLt's FP8 kernels add a bfloat16 bias to float32 outputs, a
    type cupy lacks); m, n, k multiples of 16; compute capability 8.9 or later. Hopper's FP8 tensor cores
    accumulate with fewer bits than fp32 between cuBLASLt's fp32 promotions: expect ~1e-3 relative error. Plans
    are cached by shapes, dtypes and the scale and bias addresses. Pass `workspace` (a cupy uint8 array) and `out` to
    capture it in a CUDA graph; otherwise they are allocated here.
    """
    import cupy

    (m, k), (n, k2) = a.shape, b_nk.shape
    if k != k2 or a.dtype != cupy.uint8 or b_nk.dtype != cupy.uint8:
        raise ValueError(f"fp8_gemm takes uint8 A [m, k] and B [n, k] with the same k; got {a.shape} {a.dtype}, "
                         f"{b_nk.shape} {b_nk.dtype}")
    if m % 16 or n % 16 or k % 16:
        raise ValueError(f"fp8_gemm needs m, n, k multiples of 16 (got {m}, {n}, {k})")
    if out_dtype not in ("float16", "float32"):
        raise ValueError(f"fp8_gemm writes float16 or float32, not {out_dtype}")
    if bias is not None and (out_dtype != "float16" or bias.dtype != cupy.float16 or bias.shape != (n,)):
        raise ValueError(f"fp8_gemm adds a float16 bias [{n}] to a float16 output only; got {bias.dtype} "
                         f"{bias.shape} with a {out_dtype} output")
    key = (m, n, k, out_dtype, scale_a.data.ptr, scale_b.data.ptr, bias.data.ptr if bias is not None else 0)
    with _FP8_LOCK:
        plan = _FP8_PLANS.get(key)
        if plan is None:
            plan = _FP8_PLANS[key] = LtGemm(m, n, k, "float8_e4m3", out_dtype=out_dtype, trans_b=True,
                                            epilogue="BIAS" if bias is not None else "DEFAULT", bias=bias,
                                            scales=(scale_a.data.ptr, scale_b.data.ptr), algos=1)
    stream = stream or cupy.cuda.get_current_stream()
    if out is None:
        out = cupy.empty((m, n), out_dtype)
    if workspace is None:
        workspace = cupy.empty(max(plan.workspace(0), 1), cupy.uint8)
    plan.run(0, a.data.ptr, b_nk.data.ptr, out.data.ptr, workspace.data.ptr, workspace.nbytes, stream.ptr)
    return out
