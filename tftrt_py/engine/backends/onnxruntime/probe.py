"""Whether ONNX Runtime can run here (its packages import, with the CPU provider), without importing the backend."""
from __future__ import annotations

from typing import Tuple

__all__ = ["available", "UNAVAILABLE"]

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
