"""The CPU backend on ONNX Runtime: each engine network lowered to one ONNX model at build time (weights as
initializers) and run by an ``InferenceSession`` made from the model's bytes.

Importing this package needs neither ``onnxruntime`` nor ``onnx``; :func:`available` says whether the backend
can run here and creating :class:`OnnxRuntimeBackend` raises BackendError when it cannot.
:func:`~.lowering.lower` gives the ONNX model of a network to whoever wants to run it elsewhere.
"""
from __future__ import annotations

from typing import Tuple

__all__ = ["available", "OnnxRuntimeBackend", "UNAVAILABLE"]

UNAVAILABLE = ("onnxruntime / onnx not installed: install them (pip install 'tftrt_py[cpu]') or use the numpy "
               "backend")


def available() -> Tuple[bool, str]:
    """(True, "onnxruntime <version>") when ONNX Runtime and onnx import and have the CPU provider, else
    (False, why)."""
    try:
        import onnx  # noqa: F401
        import onnxruntime
    except ImportError as exc:
        return False, f"{UNAVAILABLE} ({exc})"
    providers = getattr(onnxruntime, "get_available_providers", lambda: [])()
    if "CPUExecutionProvider" not in providers:  # (a folder named onnxruntime imports as a namespace package)
        return False, f"{UNAVAILABLE} (no CPUExecutionProvider in {providers})"
    return True, f"onnxruntime {onnxruntime.__version__}"


def __getattr__(name):
    if name == "OnnxRuntimeBackend":
        from tftrt_py.engine.backends.onnxruntime.backend import OnnxRuntimeBackend

        return OnnxRuntimeBackend
    raise AttributeError(name)
