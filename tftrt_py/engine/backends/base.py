"""The backend interface: what a backend declares (layer kinds, precisions) and how the runtime drives it.

An :class:`~tftrt_py.engine.runtime.Engine` asks its backend to :meth:`Backend.prepare_engine` once (compile,
choose tactics) and each ExecutionContext for a :class:`Runner` of its own, which executes the engine on
input arrays. Backends import nothing from the runtime, the plan or the builder: engines reach them as
arguments.
"""
from __future__ import annotations

import abc
from typing import AbstractSet, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from tftrt_py import settings
from tftrt_py.engine.errors import BackendError
from tftrt_py.engine.types import PRECISIONS

__all__ = ["Backend", "Runner", "Allocate", "Call", "deliver", "flag", "strict_types"]

#: ``outputs(index, shape) -> writable array``: where an execution writes output `index` (see ExecutionContext.execute)
Allocate = Callable[[int, Tuple[int, ...]], np.ndarray]
#: ``call(inputs, outputs) -> outputs``: an engine run on inputs of exactly its binding shapes and dtypes (unchecked),
#: in binding order, writing through an optional Allocate; outputs in binding order (see ExecutionContext.call)
Call = Callable[[Sequence[np.ndarray], Optional[Allocate]], List[np.ndarray]]


def deliver(out: np.ndarray, index: int, outputs: Optional[Allocate], copy: bool = False) -> np.ndarray:
    """Output `index` as the caller receives it: copied into ``outputs(index, shape)`` when given (cast as
    needed), else C-contiguous (a copy of its own with `copy`, for a buffer the engine reuses)."""
    if outputs is None:
        return np.array(out, order="C") if copy else np.asarray(out, order="C")
    dst = outputs(index, out.shape)
    np.copyto(dst, out, casting="unsafe")
    return dst


def flag(value) -> bool:
    return str(value).strip().lower() in ("1", "true", "yes", "on")


def strict_types(build_config: Optional[dict]) -> bool:
    """Whether an engine of `build_config` keeps every quantized layer quantized even where another precision runs
    faster (TensorRT's strict types): the config's ``strict_types``, else ``TFTRT_PY_STRICT_TYPES``."""
    return flag((build_config or {}).get("strict_types", settings.STRICT_TYPES.raw() or "0"))


class Runner(abc.ABC):
    """Executes one engine for one ExecutionContext (one thread at a time)."""

    #: Whether :meth:`native_replay` can offer replays of this engine.
    replays = False

    @abc.abstractmethod
    def execute(self, ctx, bindings: Mapping[str, np.ndarray], outputs: Optional[Allocate] = None
                ) -> Dict[str, np.ndarray]:
        """Outputs by binding name for the input arrays `bindings` (checked by ``ctx``), see ExecutionContext."""

    def native_replay(self, ctx, arrays: Sequence[np.ndarray], out_dtypes: Sequence[np.dtype]):
        """A :class:`~tftrt_py.engine.replay.Replay` of this context at the shapes of `arrays`, or None."""
        return None

    def call(self, ctx) -> Optional[Call]:
        """A :data:`Call` of this engine, or None where the backend offers none (see ExecutionContext.call)."""
        return None


class Backend(abc.ABC):
    """Runs engines: declares the layer kinds and precisions it implements, compiles engines, makes runners."""

    name: str
    #: Precisions whose layers it computes as built (others run in a wider precision).
    precisions: Tuple[str, ...] = PRECISIONS

    @property
    @abc.abstractmethod
    def kinds(self) -> AbstractSet[str]:
        """The layer kinds it runs."""

    def prepare_engine(self, engine) -> None:
        """Compile `engine` once (tactics, sessions, device check); nothing by default."""

    #: The layer kinds whose siblings reading one tensor it runs faster as one layer with their output channels
    #: concatenated (the builder's horizontal fusion merges those only).
    horizontal_kinds: Tuple[str, ...] = ("Convolution", "MatrixMultiply")

    def warm_up(self, calibrating: bool = False, timing_cache=None) -> None:
        """Load the libraries this backend's builds use, ahead of them (on a background thread while a conversion
        loads its model); with `calibrating` (the conversion will calibrate, and build with `timing_cache`, a
        TimingCache or None) also start what its anticipate() will use. Nothing by default."""

    #: Whether anticipate() does anything.
    anticipates = False

    def anticipate(self, network, precision: str, build_config: dict) -> None:
        """Start, in the background, the slowest work of a later build of `network` (optimized, its precisions
        assigned, stand-in ranges where its ranges are still being calibrated) at `precision` with
        `build_config` (BuilderConfig.recorded()); nothing by default."""

    #: Whether INT8 calibration runs the FP32 network as one engine of this backend, every float tensor an output,
    #: and bins its tensors where they are (calibration.collector): a GPU's device arrays. Host backends record
    #: through ONNX Runtime's sessions instead.
    calibrates = False

    def to_device(self, array: np.ndarray):
        """`array` as this backend's runners take it: a copy on its device (the host array itself by default)."""
        return array

    def to_host(self, array) -> np.ndarray:
        """An array this backend's runner returned, as a host array."""
        return np.asarray(array)

    def finite_abs_max(self, array) -> float:
        """The largest |value| among the finite values of a float array this backend's runner returned; -1.0 when
        it holds none (a backend that :attr:`calibrates` computes it where the array is)."""
        raise BackendError(f"backend {self.name!r} does not calibrate on a device")

    def bin_counts(self, array, scale: np.float32, bins: int) -> np.ndarray:
        """int64 counts of the finite values of a float array this backend's runner returned in `bins` bins: value
        x in bin min(|x| * scale, bins - 1), truncated, computed in float32 (calibration.calibrators' histograms)."""
        raise BackendError(f"backend {self.name!r} does not calibrate on a device")

    @abc.abstractmethod
    def create_runner(self, engine) -> Runner:
        """A runner of `engine` for one execution context."""
