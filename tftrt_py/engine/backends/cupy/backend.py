"""The cupy backend: builds an engine's GPU program (tactics timed on this GPU) and runs it in
per-context runners with CUDA-graph replay."""
from __future__ import annotations

import functools
import logging
import threading
from typing import AbstractSet, Dict

import numpy as np

from tftrt_py import settings
from tftrt_py.engine import timing_cache
from tftrt_py.engine.backends.cupy import _device
from tftrt_py.engine.backends.cupy.memory import Ledger, OutOfGpuMemory
from tftrt_py.engine.backends.base import Backend, flag, strict_types
from tftrt_py.engine.errors import BuildError, EngineError

__all__ = ["CupyBackend"]

logger = logging.getLogger(__name__)


class CupyBackend(Backend):
    """Runs engines on an NVIDIA GPU through cupy, cuDNN (frontend graphs) and cuBLAS."""

    name = "cupy"
    anticipates = True

    def __init__(self):
        _device.require()
        from tftrt_py.engine.backends.cupy import ops  # (registers the layer implementations)

        self._kinds = frozenset({"Constant", *ops.POINTWISE_KINDS, *ops.FACTORIES})
        self._tuning_lock = threading.Lock()
        self._tuner = None
        self.device = _device.device_name()
        # The libraries an engine's build reaches for after its network is optimized, loaded meanwhile: their
        # imports mostly load CUDA's libraries and hold the GIL little (beside nvmath-python's, 0.37 s on an H200
        # machine, a Python loop kept 98% of its pace), so the builder's passes hardly slow down.
        threading.Thread(target=self.warm_up, name="tftrt-backend-libraries", daemon=True).start()

    @property
    def kinds(self) -> AbstractSet[str]:
        return self._kinds

    def warm_up(self, calibrating: bool = False, timing_cache=None) -> None:
        """Import the cuDNN frontend and nvmath-python's cuBLASLt bindings (about a second between them); what fails
        is left to the build that needs them, which says why. `calibrating`: first start the processes anticipate()
        compiles in (cuDNN plans, Triton kernels; helper_processes.py), so they are ready when it gives them work,
        unless `timing_cache` holds tactics timed on this GPU: the builds would then mostly take their tactics from it
        and leave the processes little to do, while starting them slowed a warm ResNet50 INT8 conversion on an H200
        machine (5.6 -> 6.2 s, four alternating runs each; fresh: 17.4-20.2 -> 13.8-18.3 s)."""
        from tftrt_py.engine.backends.cupy import cublaslt, cudnn_warmup, triton

        if calibrating and not _timed_on_this_gpu(timing_cache):
            cudnn_warmup.stand_by()
            triton.stand_by()
        _device.cudnn_module()
        cublaslt.available()

    # -- build --------------------------------------------------------------------------------------------
    def _tuning_context(self):
        from tftrt_py.engine.backends.cupy.context import RunContext

        if self._tuner is None:
            self._tuner = RunContext(None)
        return self._tuner

    def options_for(self, build_config: dict):
        """The build options of an engine of `build_config` (its BuilderConfig.recorded()), the timing cache the
        build in progress names."""
        from tftrt_py.engine.backends.cupy.ops import BuildOptions

        cfg = build_config or {}
        allow_tf32 = flag(cfg.get("allow_tf32", settings.ALLOW_TF32.raw() or "0"))
        return BuildOptions(allow_tf32=allow_tf32, max_workspace=int(cfg.get("max_workspace_size", 1 << 30)),
                            cudnn_plans=settings.CUDNN_PLANS.get(),
                            cudnn_runtime_plans=settings.CUDNN_RUNTIME_PLANS.get(),
                            triton_tiles=settings.TRITON_TILES.get(),
                            strict_types=strict_types(cfg), timing_cache=timing_cache.for_build())

    def anticipate(self, network, precision: str, build_config: dict) -> None:
        """INT8 and FP8: compile the Triton kernels and cuDNN plans the build's quantized layers will be timed
        with (quant_planning.anticipate), in other processes, while calibration runs."""
        from tftrt_py.engine.backends.cupy import quant_planning
        from tftrt_py.engine.backends.cupy.tactics import Tuner

        options = self.options_for(build_config)
        quant_planning.anticipate(network, precision, Tuner(None, options), options)

    def prepare_engine(self, engine) -> None:
        """Compile `engine` for this GPU: choose (or re-use) tactics and upload weights.

        A plan whose tactics were chosen on another GPU is re-tuned here (and says so). Choices are read from and
        recorded in the build's timing cache (engine/timing_cache.py), saved to its file once the program is built.
        """
        from tftrt_py.engine.backends.cupy.program import compile_program

        prefer = {}
        if engine.tactics:
            if engine.device == self.device:
                prefer = dict(engine.tactics)
            else:
                logger.warning("engine %r was tuned on %r; this GPU is %r: re-tuning its tactics", engine.name,
                               engine.device, self.device)
        options = self.options_for(engine.build_config)
        ledger = Ledger(engine.name)
        from tftrt_py.engine.backends.cupy.tactics import CAPTURE_LOCK

        with self._tuning_lock, CAPTURE_LOCK:  # (see CAPTURE_LOCK: building may synchronize the device)
            try:
                options.tuner = self._tuning_context()
                program = compile_program(engine, options, prefer, ledger, options.tuner)
            except OutOfGpuMemory as exc:
                raise BuildError(str(exc)) from exc
            except BuildError:
                raise
            except EngineError as exc:
                raise BuildError(f"building engine {engine.name!r} for the GPU failed: {exc}") from exc
            except Exception as exc:
                if _device.is_out_of_memory(exc):
                    raise BuildError(f"out of GPU memory while building engine {engine.name!r} "
                                     f"({ledger.report()}): lower the batch size or max_workspace_size") from exc
                raise BuildError(f"building engine {engine.name!r} for the GPU failed: "
                                 f"{type(exc).__name__}: {exc}") from exc
        engine.tactics = program.tactics
        engine.device = self.device
        engine.build_config = dict(engine.build_config, allow_tf32=options.allow_tf32)
        engine.cupy_program = program
        _save(options.timing_cache)

    # -- run ------------------------------------------------------------------------------------------------
    #: INT8 calibration computes on this GPU and bins each tensor here (calibration.collector.EngineRecording):
    #: Keras ResNet50's two batches of 8 (1.4 GB of tensors each) in 1.3-1.7 s with warm caches on an H200 machine,
    #: 3.0-3.7 s through ONNX Runtime sessions and host histograms on its 16 cores.
    calibrates = True

    def to_device(self, array):
        return _device.require().asarray(array)

    def to_host(self, array):
        return array if isinstance(array, np.ndarray) else array.get()

    def finite_abs_max(self, array) -> float:
        from tftrt_py.engine.backends.cupy import histograms

        return histograms.finite_abs_max(array)

    def bin_counts(self, array, scale: np.float32, bins: int) -> np.ndarray:
        from tftrt_py.engine.backends.cupy import histograms

        return histograms.bin_counts(array, scale, bins)

    def create_runner(self, engine):
        from tftrt_py.engine.backends.cupy.runner import Runner

        program = getattr(engine, "cupy_program", None)
        if program is None:
            engine.prepare()
            program = engine.cupy_program
        return Runner(engine, program)

    def memory_report(self, engine) -> Dict[str, int]:
        """Device bytes the engine holds: weights, activations, workspace, io, total, peak."""
        program = getattr(engine, "cupy_program", None)
        return program.ledger.report() if program is not None else {}


def _save(cache) -> None:
    """Write what this build recorded to the cache's file; a failure is said (once per reason), not raised: the
    engine is built."""
    if cache is None or cache.path is None or not cache.unsaved:
        return
    try:
        cache.save()
    except OSError as exc:
        _warn_once(f"could not save the timing cache {cache.path} ({type(exc).__name__}: {exc.strerror or exc}): "
                   f"later builds time their tactics again")


@functools.lru_cache(maxsize=None)
def _warn_once(message: str) -> None:
    logger.warning("%s", message)


def _timed_on_this_gpu(cache) -> bool:
    """Whether the timing cache `cache` (or None) holds tactics timed on a GPU of this one's name."""
    if cache is None:
        return False
    gpu = _device.device_name()
    return any(device.get("gpu") == gpu for device in cache.devices())
