"""TensorFlow's GPUs beside our engines: memory growth, or an error saying what to set.

TensorFlow's GPU build reserves nearly all of a GPU's memory once it initializes its devices, unless memory
growth or a memory limit is configured; our engines allocate through cupy, outside TensorFlow's allocator.
:func:`prepare_tensorflow_gpus` runs when engine ops choose the cupy backend (and may be called earlier by the
user): it reads what TensorFlow reports (:func:`tensorflow_facts`), decides (:func:`decide`, a pure function of
those facts) and applies the decision once per process. Whether TensorFlow has initialized its devices is
learned by trying: ``set_memory_growth`` raises RuntimeError once it has.
"""
from __future__ import annotations

import dataclasses
import logging
import threading
from typing import Optional, Tuple

from tftrt_py import settings
from tftrt_py.engine.backends.cupy.memory import BUDGET_ENV, Budget

__all__ = ["FORCE_GROWTH_ENV", "GpuFacts", "TensorFlowFacts", "Decision", "TensorFlowGpuMemoryError", "decide",
           "tensorflow_facts", "prepare_tensorflow_gpus"]

logger = logging.getLogger(__name__)

#: TensorFlow's own switch, read when it initializes its GPUs: "true" grows, "false" reserves.
FORCE_GROWTH_ENV = settings.FORCE_GPU_ALLOW_GROWTH.name


class TensorFlowGpuMemoryError(RuntimeError):
    """TensorFlow holds its GPUs' memory (initialized without growth or a limit): engines would find none."""


@dataclasses.dataclass(frozen=True)
class GpuFacts:
    """One GPU as TensorFlow reports it."""

    name: str  # e.g. /physical_device:GPU:0
    memory_growth: bool  # tf.config.experimental.get_memory_growth
    logical_devices: int  # len(tf.config.get_logical_device_configuration(gpu) or []): a user's memory limit


@dataclasses.dataclass(frozen=True)
class TensorFlowFacts:
    gpus: Tuple[GpuFacts, ...]
    initialized: bool  # TensorFlow created its devices (set_memory_growth then raises RuntimeError)
    force_growth: Optional[str] = None  # FORCE_GROWTH_ENV as set, or None
    budget: Optional[int] = None  # BUDGET_ENV in bytes, or None


@dataclasses.dataclass(frozen=True)
class Decision:
    grow: Tuple[str, ...] = ()  # GPUs to enable memory growth on
    error: Optional[str] = None  # TensorFlowGpuMemoryError's message
    note: str = ""  # what is logged
    level: int = logging.DEBUG


def decide(facts: TensorFlowFacts) -> Decision:
    """What to do about TensorFlow's GPUs so that engines have memory beside TensorFlow (no I/O)."""
    if not facts.gpus:
        return Decision(note="TensorFlow sees no GPU: engines share the GPU with no TensorFlow allocator")
    if facts.force_growth is not None:
        if facts.force_growth == "true":
            return Decision(note=f"{FORCE_GROWTH_ENV}=true: TensorFlow grows its GPU memory beside the engines")
        return Decision(level=logging.WARNING,
                        note=f"{FORCE_GROWTH_ENV}={facts.force_growth!r} is left as set, but TensorFlow grows its GPU "
                             f"memory only with 'true' and may leave engines no memory")
    bare = tuple(g.name for g in facts.gpus if not g.memory_growth and not g.logical_devices)
    if not bare:
        return Decision(note="TensorFlow's GPUs have memory growth or a memory limit: engines allocate beside them")
    if not facts.initialized:
        return Decision(grow=bare, level=logging.INFO,
                        note=f"enabling memory growth on TensorFlow's {', '.join(bare)} (not configured, not yet "
                             f"initialized) so that TRTEngineOp engines have GPU memory beside TensorFlow's")
    if facts.budget is not None:
        return Decision(level=logging.WARNING,
                        note=f"TensorFlow initialized {', '.join(bare)} without memory growth or a memory limit "
                             f"that tf.config reports; trusting {BUDGET_ENV} that {facts.budget / 2**20:.0f} MiB "
                             f"are left to the engines (e.g. by a ConfigProto's per_process_gpu_memory_fraction)")
    return Decision(error=(
        f"TensorFlow initialized {', '.join(bare)} without memory growth or a memory limit, so it may hold nearly "
        f"all GPU memory and leave TRTEngineOp engines none. Before TensorFlow first uses the GPU, set one of: "
        f"the environment variable {FORCE_GROWTH_ENV}=true; "
        f"tf.config.experimental.set_memory_growth(gpu, True) for each gpu in "
        f"tf.config.list_physical_devices('GPU') (or call "
        f"tftrt_py.engine_op.gpu_memory.prepare_tensorflow_gpus() right after importing TensorFlow); or "
        f"tf.config.set_logical_device_configuration(gpu, [tf.config.LogicalDeviceConfiguration("
        f"memory_limit=<MiB for TensorFlow>)]) leaving N MiB for the engines, with {BUDGET_ENV}=<N>MiB. "
        f"(A TF1 ConfigProto's gpu_options are invisible to tf.config: with per_process_gpu_memory_fraction or "
        f"allow_growth set there, set {BUDGET_ENV} to the memory left to engines.)"))


def tensorflow_facts(tf, gpus, initialized: bool) -> TensorFlowFacts:
    """What TensorFlow (module `tf`) reports about its physical `gpus`, and the two environment variables."""
    return TensorFlowFacts(
        gpus=tuple(GpuFacts(g.name, bool(tf.config.experimental.get_memory_growth(g)),
                            len(tf.config.get_logical_device_configuration(g) or [])) for g in gpus),
        initialized=initialized, force_growth=settings.FORCE_GPU_ALLOW_GROWTH.raw(),
        budget=Budget.from_setting(settings.GPU_MEMORY_BUDGET.raw()).limit)


_lock = threading.Lock()
_decision: Optional[Decision] = None


def prepare_tensorflow_gpus() -> Decision:
    """Leave engines room beside TensorFlow's GPUs: decided and applied on the first call, the decision kept.

    Raises TensorFlowGpuMemoryError (on every call) when TensorFlow already holds its GPUs' memory.
    """
    global _decision
    with _lock:
        if _decision is None:
            import tensorflow as tf

            gpus = tf.config.list_physical_devices("GPU")
            facts = tensorflow_facts(tf, gpus, initialized=False)
            decision = decide(facts)
            try:
                for gpu in gpus:
                    if gpu.name in decision.grow:
                        tf.config.experimental.set_memory_growth(gpu, True)
            except RuntimeError:  # "Physical devices cannot be modified after being initialized"
                decision = decide(dataclasses.replace(facts, initialized=True))
            logger.log(decision.level, "%s", decision.note or decision.error)
            _decision = decision
        if _decision.error:
            raise TensorFlowGpuMemoryError(_decision.error)
        return _decision
