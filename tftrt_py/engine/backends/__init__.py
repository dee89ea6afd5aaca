"""Backends run layer kinds. ``numpy`` always works (the reference); ``cupy`` needs an NVIDIA GPU;
``onnxruntime`` (the CPU backend) needs the onnxruntime and onnx packages."""
from __future__ import annotations

import logging
import threading
from typing import Callable, Dict, Optional

from tftrt_py.engine.backends import cupy, onnxruntime
from tftrt_py.engine.backends.base import Backend
from tftrt_py.engine.backends.numpy_backend import NumpyBackend
from tftrt_py.engine.errors import BackendError

__all__ = ["get_backend", "register_backend", "backend_names", "default_backend_name"]

logger = logging.getLogger(__name__)

_FACTORIES: Dict[str, Callable[[], Backend]] = {}
_INSTANCES: Dict[str, Backend] = {}
_INSTANCES_LOCK = threading.Lock()  # (a backend may first be asked for on a warm-up thread)


def register_backend(name: str, factory: Callable[[], Backend]) -> None:
    _FACTORIES[name] = factory


def backend_names():
    return sorted(_FACTORIES)


def get_backend(name: str = "numpy") -> Backend:
    """The backend called `name`, created once per process."""
    with _INSTANCES_LOCK:
        if name not in _INSTANCES:
            if name not in _FACTORIES:
                raise BackendError(f"unknown backend {name!r} (known: {', '.join(backend_names())})")
            _INSTANCES[name] = _FACTORIES[name]()
    return _INSTANCES[name]


register_backend("numpy", NumpyBackend)
# cupy (GPU): registered always, usable only where cupy sees a GPU; its package loads the backend on first use.
register_backend("cupy", lambda: cupy.CupyBackend())
# onnxruntime (CPU): registered always, usable where onnxruntime and onnx import.
register_backend("onnxruntime", lambda: onnxruntime.OnnxRuntimeBackend())

_DEFAULT: Optional[str] = None


def default_backend_name() -> str:
    """``"cupy"`` when a GPU is usable here, else ``"onnxruntime"`` when it imports, else ``"numpy"`` (decided
    and logged once)."""
    global _DEFAULT
    if _DEFAULT is None:
        reasons = []
        for name, available in (("cupy", cupy.available), ("onnxruntime", onnxruntime.available)):
            ok, why = available()
            reasons.append(why)
            if ok:
                _DEFAULT = name
                break
        else:
            _DEFAULT = "numpy"
        logger.info("engine backend: %s (%s)", _DEFAULT, "; ".join(reasons))
    return _DEFAULT
