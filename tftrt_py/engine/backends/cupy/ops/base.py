"""What every layer implementation (an *op*, one tactic) provides, and the spec it is built from."""
from __future__ import annotations

import dataclasses
import json
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

__all__ = ["Op", "FollowedOp", "Spec", "BuildOptions", "register", "FACTORIES", "QUANTIZED_FACTORIES",
           "quantized_candidates", "align"]

Factory = Callable[["Spec"], List["Op"]]

#: kind -> factory(spec) -> candidate ops (fastest wins at build time).
FACTORIES: Dict[str, Factory] = {}
#: (kind, quantized format: "INT8" or "FP8") -> factory of the candidates of a quantized layer (``spec.quant``).
QUANTIZED_FACTORIES: Dict[Tuple[str, str], Factory] = {}


def register(*kinds: str, formats: Sequence[str] = ()):
    """Register a candidates factory for layers of `kinds`; with `formats`, for those layers quantized in each
    format instead."""
    def wrap(fn):
        for kind in kinds:
            if formats:
                QUANTIZED_FACTORIES.update({(kind, fmt): fn for fmt in formats})
            else:
                FACTORIES[kind] = fn
        return fn

    return wrap


def quantized_candidates(spec: "Spec") -> List["Op"]:
    """The candidates of a quantized layer (``spec.quant``, its format INT8 unless named): the factory registered
    for its kind and format, none where there is no such factory."""
    factory = QUANTIZED_FACTORIES.get((spec.layer.kind, spec.quant.get("format", "INT8")))
    return factory(spec) if factory is not None else []


def align(n: int, to: int = 256) -> int:
    return (int(n) + to - 1) // to * to


def pad3(values, fill):
    """Per-spatial-dim values padded to 3 dims with `fill` (the 3-d kernels serve 1-d and 2-d layers)."""
    values = list(values)
    return values + [fill] * (3 - len(values))


class Op:
    """One way to run one layer; shared by every execution context of an engine.

    ``run(rc, ins, outs)`` enqueues the work on the current (context's) stream, reading cupy
    arrays `ins` and writing the preallocated `outs`; `rc` gives the context's cuDNN handle,
    cuBLAS handle and workspace.
    """

    #: Recorded in Engine.tactics (JSON).
    tactic: Dict[str, Any] = {}
    #: Scratch bytes taken from the context's workspace while running.
    workspace: int = 0
    #: False when the op synchronizes with the host (it then runs between captured graphs).
    capturable: bool = True
    #: Device bytes of weights this op holds.
    device_bytes: int = 0
    #: True when the op runs cuDNN (its context then creates a cuDNN handle bound to its stream).
    uses_cudnn: bool = False

    def run(self, rc, ins: Sequence, outs: Sequence) -> None:
        raise NotImplementedError

    def converts_input(self, dtype: str) -> bool:
        """Whether this op takes its first input in float `dtype` from now on, converting it where it copies it
        anyway (a convolution that pads the channels of its input first), so that a cast before it can go."""
        return False


class FollowedOp(Op):
    """An op followed by work of its own in the same step (a kernel after it): what the op needs from its context
    (workspace, a cuDNN handle on its stream, capture) and holds are the inner op's."""

    def __init__(self, inner: Op):
        self.inner = inner
        self.workspace, self.device_bytes = inner.workspace, inner.device_bytes
        self.capturable, self.uses_cudnn = inner.capturable, inner.uses_cudnn


@dataclasses.dataclass
class BuildOptions:
    allow_tf32: bool = False
    max_workspace: int = 1 << 30
    #: How many cuDNN plans (heuristics order) are built and timed per convolution.
    cudnn_plans: int = 2
    #: How many of those may be runtime-compiled (cuDNN's runtime fusion engine: 0.2-0.8 s of NVRTC and ptxas per
    #: plan on an H100, against milliseconds for its precompiled engines); the rest come from precompiled engines.
    cudnn_runtime_plans: int = 1
    #: How many Triton kernels (triton_conv.conv_tiles) are compiled and timed per INT8, FP8 or FP16 convolution.
    triton_tiles: int = 3
    #: INT8 layers stay int8 even where the fp16 kernel is faster (TensorRT's strict types).
    strict_types: bool = False
    #: The backend's tuning context (stream, handles, workspace) for building cuDNN plans.
    tuner: Any = None
    #: The engine.timing_cache.TimingCache the tuner reads and fills (None: every choice is timed).
    timing_cache: Any = None


@dataclasses.dataclass
class Spec:
    """A layer as the backend sees it: storage dtypes and shapes of its (cast) inputs and outputs."""

    layer: Any
    in_shapes: List[Tuple[int, ...]]
    in_dtypes: List[str]
    out_shapes: List[Tuple[int, ...]]
    out_dtypes: List[str]
    #: The float dtype the layer computes and stores in (float16 for FP16/INT8 layers).
    cdt: str
    options: BuildOptions
    #: The tactic recorded for this layer by an earlier build on this GPU (try it first).
    prefer: Optional[Dict[str, Any]] = None
    #: INT8 and FP8 layers (see ops/quant.py): convolutions the input scale ``in_scale``, matrix multiplies the
    #: operands (``a``, ``b``), padded reduction dim ``kp`` and dequantization scales ``dq``; ``dual_scale``
    #: when the layer also writes its output as int8 (a second output).
    quant: Optional[Dict[str, Any]] = None

    @property
    def params(self) -> Dict[str, Any]:
        return self.layer.params

    @property
    def weights(self) -> Dict[str, np.ndarray]:
        return self.layer.weights

    def signature(self) -> str:
        """What determines the tactic choice: kind, shapes, dtypes, params and weight shapes."""
        layer = self.layer
        return json.dumps([layer.kind, self.in_shapes, self.in_dtypes, self.out_dtypes, layer.params,
                           {k: list(v.shape) for k, v in sorted(layer.weights.items())}], sort_keys=True,
                          default=str)
