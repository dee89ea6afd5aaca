"""A run context: the stream, cuDNN handle, cuBLAS handle and workspace that ops run with.

Each execution context owns one (so contexts of one engine run concurrently from threads);
the backend owns one more for building and timing tactics.
"""
from __future__ import annotations

from typing import Optional

from tftrt_py.engine.backends.cupy import _device
from tftrt_py.engine.backends.cupy.cublas import Cublas
from tftrt_py.engine.backends.cupy.memory import Ledger

__all__ = ["RunContext", "CUBLAS_WORKSPACE"]

#: cuBLAS's own workspace per handle (NVIDIA recommends 32 MiB on Hopper).
CUBLAS_WORKSPACE = 32 << 20


class RunContext:
    def __init__(self, ledger: Optional[Ledger] = None, cudnn: bool = True, cublas: bool = True,
                 workspace: int = 0, cublas_workspace: int = CUBLAS_WORKSPACE):
        cupy = _device.require()
        self.ledger = ledger
        self.stream = cupy.cuda.Stream(non_blocking=True)
        self.charged = 0
        self.workspace = None
        self.workspace_ptr = 0
        self.cudnn = None
        self.cublas = None
        self._cublas_ws = None
        try:  # a context that cannot be made gives back what it took
            if cudnn and _device.cudnn_module() is not None:
                mod = _device.cudnn_module()
                self.cudnn = mod.create_handle()
                mod.set_stream(self.cudnn, self.stream.ptr)
            if cublas:
                self._cublas_ws = self._alloc(cublas_workspace)
                self.cublas = Cublas(self.stream.ptr, self._cublas_ws.data.ptr, cublas_workspace)
            self.ensure_workspace(workspace)
        except BaseException:
            self.close()
            raise

    def _alloc(self, nbytes: int):
        cupy = _device.require()
        if self.ledger is not None:
            mem = self.ledger.alloc("workspace", nbytes)
            self.charged += max(int(nbytes), 1)
        else:
            mem = cupy.get_default_memory_pool().malloc(max(int(nbytes), 1))
        return cupy.ndarray((max(int(nbytes), 1),), cupy.uint8, mem)

    def ensure_workspace(self, nbytes: int) -> None:
        """Grow the op workspace to at least `nbytes` (never while a graph that uses it exists)."""
        if nbytes <= (self.workspace.size if self.workspace is not None else 0):
            return
        if self.workspace is not None and self.ledger is not None:
            self.ledger.release("workspace", self.workspace.size)
            self.charged -= self.workspace.size
        self.workspace = None
        self.workspace = self._alloc(nbytes)
        self.workspace_ptr = self.workspace.data.ptr

    def scratch(self, offset: int, shape, dtype):
        """A view of the workspace at byte `offset`."""
        cupy = _device.require()
        return cupy.ndarray(tuple(shape), dtype, self.workspace.data + int(offset))

    def close(self) -> None:
        if self.cublas is not None:
            self.cublas.close()
            self.cublas = None
        if self.cudnn is not None:
            try:
                _device.cudnn_module().destroy_handle(self.cudnn)
            except Exception:
                pass
            self.cudnn = None
        if self.ledger is not None and self.charged:
            self.ledger.release("workspace", self.charged)
            self.charged = 0
