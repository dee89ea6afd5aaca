"""The CPU backend on ONNX Runtime: each engine network lowered to one ONNX model at build time (weights as
initializers) and run by an ``InferenceSession`` made from the model's bytes.

Importing this package needs neither ``onnxruntime`` nor ``onnx``; :func:`available` says whether the backend
can run here and creating :class:`OnnxRuntimeBackend` raises BackendError when it cannot.
:func:`~.lowering.lower` gives the ONNX model of a network to whoever wants to run it elsewhere.
"""
from __future__ import annotations

from tftrt_py.engine.backends.onnxruntime.probe import UNAVAILABLE, available

__all__ = ["available", "OnnxRuntimeBackend", "UNAVAILABLE"]


def __getattr__(name):
    if name == "OnnxRuntimeBackend":
        from tftrt_py.engine.backends.onnxruntime.backend import OnnxRuntimeBackend

        return OnnxRuntimeBackend
    raise AttributeError(name)
