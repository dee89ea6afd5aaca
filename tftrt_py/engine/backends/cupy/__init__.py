"""The GPU backend: cupy kernels, cuDNN frontend graphs and cuBLAS, NHWC inside the engine.

Importing this package needs no GPU; :func:`available` says whether the backend can run here and
creating :class:`CupyBackend` raises BackendError when it cannot.

Environment: ``TFTRT_PY_ALLOW_TF32=1`` lets FP32 engines use TF32 tensor cores (off by default;
a ``allow_tf32`` key in the build config wins), ``TFTRT_PY_CUDNN_PLANS`` is how many cuDNN plans
are built and timed per convolution (2: building one compiles its kernels, and on an H100 ResNet-50's three
FP16 engines built in 12.9 s with 2 against 21.1 s with 4, both with cuDNN's kernel cache warm, and ran as fast),
``TFTRT_PY_TRITON_TILES`` how many Triton kernels per INT8, FP8 or FP16 convolution (3 of the tiles that suit its size:
ops/triton_conv.py), ``TFTRT_PY_CUDA_GRAPHS=0`` runs engines without graph capture,
``TFTRT_PY_CHECK_TACTICS=1`` checks every candidate against the numpy backend while building (INT8
layers are checked by tests/engine/gpu/test_int8.py instead), ``TFTRT_PY_INT8_CONV`` (tests) restricts
int8 convolutions to one path (a cuDNN graph variant of ops/int8.py, "gemm" or "triton").
"""
from __future__ import annotations

from typing import Tuple

from tftrt_py.engine.backends.cupy._device import UNAVAILABLE, probe, start_driver

__all__ = ["available", "start_driver", "CupyBackend", "UNAVAILABLE"]


def available() -> Tuple[bool, str]:
    """(True, device name) when cupy sees a CUDA GPU, else (False, why)."""
    return probe()


def __getattr__(name):
    if name == "CupyBackend":
        from tftrt_py.engine.backends.cupy.backend import CupyBackend

        return CupyBackend
    raise AttributeError(name)
