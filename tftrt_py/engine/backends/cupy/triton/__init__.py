"""Kernels written in Triton, compiled ahead of time to cubins and launched through cupy.

Triton serves as a compiler only: its JIT launcher takes streams and devices from PyTorch, which the engine
does not use. :func:`compile_kernel` compiles one specialization (the parameters given types, the others
constexprs) for a GPU architecture, through Triton's on-disk cache, or takes it from :func:`prefetch` (a
build asks for its kernels first; they compile side by side in another process); :class:`CompiledKernel`
loads the cubin into cupy and launches it on the current stream. Triton is optional (the ``gpu`` extra):
without it these kernels are simply not candidates.
"""
from __future__ import annotations

import base64
import concurrent.futures
import functools
import importlib
import importlib.util
import json
import logging
import os
import threading
import time
from typing import Dict, Sequence, Tuple

import numpy as np

from tftrt_py.engine.backends.cupy import helper_processes

__all__ = ["available", "request", "compile_kernel", "prefetch", "stand_by", "artifacts", "CompiledKernel", "Request"]

logger = logging.getLogger(__name__)

#: The module the compile process runs.
COMPILE_WORKER = f"{__name__}.compile_worker"


@functools.lru_cache(maxsize=None)
def available() -> bool:
    """Triton is installed and can compile (its own ptxas) for this GPU."""
    try:
        import triton  # noqa: F401
        from triton.backends.compiler import GPUTarget  # noqa: F401
        return True
    except Exception as exc:  # ImportError, or a broken install
        logger.debug("Triton kernels unavailable: %s", exc)
        return False


class CompiledKernel:
    """A compiled Triton kernel: cubin, entry name, block size, shared memory and parameter count."""

    def __init__(self, cubin: bytes, name: str, num_warps: int, shared: int, params: int):
        self.cubin, self.name, self.threads, self.shared, self.params = cubin, name, 32 * num_warps, shared, params
        self._functions: Dict[int, object] = {}

    def _function(self):
        import cupy

        device = cupy.cuda.runtime.getDevice()
        fn = self._functions.get(device)
        if fn is None:
            module = cupy.cuda.function.Module()
            module.load(self.cubin)
            fn = module.get_function(self.name)
            if self.shared > 48 * 1024:  # (the function keeps its module loaded)
                drv = cupy.cuda.driver
                attr = getattr(drv, "CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES", 8)
                drv.funcSetAttribute(fn.ptr, attr, self.shared)
            self._functions[device] = fn
        return fn

    def launch(self, grid: int, args: Sequence) -> None:
        """Launch `grid` programs on the current stream with `args` (numpy scalars of the parameters' types:
        np.uint64 device addresses, 0 for unused ones); the parameters Triton adds after them (its scratch
        buffers, unused here) get null pointers."""
        args = list(args) + [np.uint64(0)] * (self.params - len(args))
        self._function()((int(grid),), (self.threads,), tuple(args), shared_mem=self.shared)


def _param_count(ptx: str, name: str) -> int:
    start = ptx.index(f".entry {name}(")
    return ptx[start:ptx.index(")", start)].count(".param")


#: What determines a compiled kernel: (module, function, typed parameters, constexprs, multiples of 16, warps,
#: stages, compute capability).
Request = Tuple[str, str, Tuple[Tuple[str, str], ...], Tuple[Tuple[str, object], ...], Tuple[str, ...], int, int,
                int]

_PREFETCHED: Dict[Request, concurrent.futures.Future] = {}
_PREFETCH_LOCK = threading.Lock()
#: Seconds a build waits for a prefetched kernel before compiling it itself.
PREFETCH_WAIT_S = 600


def artifacts(request: Request) -> Tuple[bytes, str, int, int, int]:
    """Compile `request`: (cubin, entry name, warps, shared memory bytes, parameter count)."""
    import triton
    from triton.backends.compiler import GPUTarget

    module, fn_name, params, constexprs, multiples, num_warps, num_stages, capability = request
    fn = getattr(importlib.import_module(module), fn_name)
    types = dict(params)
    signature = {n: types.get(n, "constexpr") for n in fn.arg_names}
    attrs = {(fn.arg_names.index(n),): [["tt.divisibility", 16]]  # buffers are 16-byte aligned
             for n, t in types.items() if t.startswith("*") or n in multiples}
    src = triton.compiler.ASTSource(fn, signature, constexprs=dict(constexprs), attrs=attrs)
    k = triton.compile(src, target=GPUTarget("cuda", capability, 32),
                       options={"num_warps": num_warps, "num_stages": num_stages})
    meta = k.metadata
    if getattr(meta, "global_scratch_size", 0) or getattr(meta, "profile_scratch_size", 0):
        raise RuntimeError(f"Triton kernel {fn_name} wants scratch memory, which this launcher does not give")
    return k.asm["cubin"], meta.name, meta.num_warps, meta.shared, _param_count(k.asm["ptx"], meta.name)


@functools.lru_cache(maxsize=None)
def _compile(request: Request) -> CompiledKernel:
    future = _PREFETCHED.get(request)
    if future is not None:
        try:
            return CompiledKernel(*future.result(timeout=PREFETCH_WAIT_S))
        except Exception as exc:  # the compile process failed, or this kernel did not compile there
            logger.debug("prefetched Triton kernel unavailable (%s): compiling it here", exc)
    start = time.perf_counter()
    kernel = CompiledKernel(*artifacts(request))
    logger.debug("Triton kernel %s %s compiled in this process in %.2f s", request[1], dict(request[3]),
                 time.perf_counter() - start)
    return kernel


def request(module: str, fn_name: str, params: Dict[str, str], constexprs: Dict[str, object], capability: int,
            multiples: Sequence[str] = (), num_warps: int = 4, num_stages: int = 3) -> Request:
    """The compile request of `module`.`fn_name` (a ``triton.jit`` function) for GPUs of compute `capability`
    (e.g. 90): `params` maps its runtime parameters to Triton types ("*i8", "*fp16", "i32", "fp32", ...;
    pointers 16-byte aligned), `constexprs` gives every other parameter; the integer parameters named in
    `multiples` are promised multiples of 16 (so Triton vectorizes the accesses they stride)."""
    return (module, fn_name, tuple(sorted(params.items())), tuple(sorted(constexprs.items())),
            tuple(sorted(multiples)), int(num_warps), int(num_stages), int(capability))


def compile_kernel(req: Request) -> CompiledKernel:
    """The compiled kernel of `req`: prefetched, from Triton's on-disk cache, or compiled here. Safe to call from
    several threads (each compile has its own MLIR context; Triton's cache writes files atomically)."""
    return _compile(req)


def prefetch(requests: Sequence[Request], threads: bool = False) -> None:
    """Start compiling `requests` while the build goes on: in a separate process, in parallel, or with `threads` in
    THREADS threads of this process (for a few kernels needed soon: Triton releases the GIL for most of a compile,
    4 kernels took 1.7 s in 4 threads against 3.7 s one after another on an H200 machine, while a new compile
    process answers its first kernel after 2.6 s; for many, the Python parts would take turns). The process runs
    this package's ``compile_worker`` module (a module of our own as its ``__main__``, so a user's script is never
    re-imported by its worker processes) and answers in JSON lines; a kernel it fails to deliver is compiled here
    when needed. A compile process started ahead (stand_by) serves the first prefetch to a process, or ends."""
    with _PREFETCH_LOCK:
        todo = [r for r in dict.fromkeys(requests) if r not in _PREFETCHED]
        futures = [concurrent.futures.Future() for _ in todo]
        _PREFETCHED.update(zip(todo, futures))
    if threads:
        pool = _threads()
        for req, future in zip(todo, futures):
            pool.submit(_deliver, req, future)
        if todo:
            logger.debug("compiling %d Triton kernel(s) in threads", len(todo))
        return
    try:
        proc = helper_processes.take(COMPILE_WORKER) if todo else None
        if proc is not None:
            helper_processes.give(proc, json.dumps(todo).encode())
    except Exception as exc:
        for f in futures:
            f.set_exception(RuntimeError(f"could not start the Triton compile process: {exc}"))
        return
    finally:
        helper_processes.release(COMPILE_WORKER)
    if proc is not None:
        logger.info("compiling %d Triton kernel(s) in a separate process", len(todo))
        threading.Thread(target=_collect, args=(proc, futures), daemon=True, name="triton-prefetch").start()


def stand_by() -> None:
    """Start the compile process ahead of the first prefetch (helper_processes.stand_by), for a conversion that will
    calibrate: its interpreter, imports and fork server (which imports Triton) start while the model loads. Nothing
    where Triton is not installed."""
    if importlib.util.find_spec("triton") is not None:
        helper_processes.stand_by(COMPILE_WORKER, 1)


#: Threads compiling kernels prefetched with threads=True.
THREADS = 4


@functools.lru_cache(maxsize=None)
def _threads() -> concurrent.futures.ThreadPoolExecutor:
    return concurrent.futures.ThreadPoolExecutor(max(1, min(THREADS, os.cpu_count() or 1)), "tftrt-triton-compile")


def _deliver(req: Request, future: concurrent.futures.Future) -> None:
    try:
        future.set_result(artifacts(req))
    except Exception as exc:  # compiled again (and the failure reported) where it is needed
        future.set_exception(exc)


def _collect(proc, futures) -> None:
    """Deliver the compile process's answers: {"index": i, "artifacts": [base64 cubin, name, warps, shared, params]}
    or {"index": i, "error": why}, one JSON object a line; anything else ends the collection."""
    start = time.perf_counter()
    seconds = []
    try:
        for line in proc.stdout:
            try:
                answer = json.loads(line)
                f = futures[int(answer["index"])]
                if "error" in answer:
                    f.set_exception(RuntimeError(str(answer["error"])))
                    continue
                cubin, name, warps, shared, params = answer["artifacts"]
                f.set_result((base64.b64decode(cubin), str(name), int(warps), int(shared), int(params)))
                seconds.append((float(answer.get("seconds", 0.0)), time.perf_counter() - start, str(name)))
            except (ValueError, KeyError, IndexError, TypeError, concurrent.futures.InvalidStateError) as exc:
                logger.debug("unreadable answer from the Triton compile process: %s", exc)
                break
    finally:
        proc.stdout.close()
        proc.wait()
        logger.info("Triton compile process: %d of %d kernel(s) in %.1f s", sum(
            f.done() and f.exception() is None for f in futures), len(futures), time.perf_counter() - start)
        if seconds:
            compile_s = sorted(s for s, _, _ in seconds)
            logger.debug("Triton compile process: each kernel %.2f s median, %.2f s at most; the first ready after "
                         "%.1f s; slowest: %s", compile_s[len(compile_s) // 2], compile_s[-1],
                         min(at for _, at, _ in seconds), sorted(seconds, reverse=True)[:3])
        for f in futures:
            if not f.done():
                f.set_exception(RuntimeError("the Triton compile process ended without this kernel"))
