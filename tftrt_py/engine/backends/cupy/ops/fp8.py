"""FP8 (E4M3) layers on the cupy backend: which GPUs may build them, and what runs them.

FP8 needs compute capability 8.9 or later (Ada, Hopper): building an FP8 engine on an older GPU is a
BuildError saying what to use instead. On a GPU that has FP8, FP8 layers run in FP16 for now (logged once per engine,
and ``layer.precision`` says so, so plans and the numpy backend compute what ran), as TensorRT runs a layer in
a wider precision where it has no faster narrow kernel. The kernels to come: cuDNN 9.19 runs E4M3 convolution
fprop on an H100 (fp32 accumulation, dequantize/bias/activation epilogue, fp16 output: 0.67-1.51x the fp16
time per ResNet-50 layer, before quantizing the input), and cuBLASLt's FP8 GEMM (``cublaslt.fp8_gemm``).
"""
from __future__ import annotations

import logging
from typing import Tuple

from tftrt_py.engine.errors import BuildError

__all__ = ["MIN_CAPABILITY", "check_device", "run_fp8_layers_in_fp16"]

logger = logging.getLogger(__name__)

#: The oldest GPU generation with FP8 tensor cores (Ada Lovelace, sm_89).
MIN_CAPABILITY: Tuple[int, int] = (8, 9)


def _capability(text: str) -> Tuple[int, int]:
    """cupy's compute capability string ("90", "89", "100") as (major, minor)."""
    return int(text[:-1]), int(text[-1])


def check_device(engine_name: str, precision: str, capability: str, device: str) -> None:
    """BuildError when an FP8 engine is built on a GPU below compute capability 8.9."""
    if precision == "FP8" and _capability(capability) < MIN_CAPABILITY:
        raise BuildError(
            f"engine {engine_name!r}: precision FP8 needs a GPU of compute capability "
            f"{'.'.join(map(str, MIN_CAPABILITY))} or later (Ada, Hopper: L4, L40, H100, H200); {device} has "
            f"{'.'.join(map(str, _capability(capability)))}. Build with precision_mode='INT8' (same calibration) "
            f"or 'FP16' instead")


def run_fp8_layers_in_fp16(net) -> int:
    """Set every FP8 layer of `net` to FP16 (the kernels this backend runs them with); how many there were."""
    layers = [layer for layer in net.layers if layer.precision == "FP8"]
    for layer in layers:
        layer.precision = "FP16"
    if layers:
        logger.warning("engine %s: %d FP8 layer(s) run in FP16 on the cupy backend (its FP8 kernels are not wired "
                       "in yet)", net.name, len(layers))
    return len(layers)
