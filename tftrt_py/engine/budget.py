"""What running a network takes, and what this machine lets one engine take.

:func:`peak_memory` walks the layers in order, as the runtime does: an input or a layer's output is live from
where it is made until its last reader has run (network outputs to the end), a layer holds its kind's scratch
while it runs, and at the end the outputs are copied into the caller's buffers. The peak, plus the weights, is
what the engine needs at once. :func:`declared_work` adds up each layer's work (its kind's ``work``, in
multiply-add equivalents). A plan is refused at load when either passes its limit: :func:`max_engine_bytes`
(half of the host's memory, or the GPU's free memory for cupy plans; ``TFTRT_PY_MAX_ENGINE_BYTES`` overrides)
and :func:`max_engine_work` (``TFTRT_PY_MAX_ENGINE_WORK``).
"""
from __future__ import annotations

import logging
import os
from typing import Dict, NamedTuple, Optional

import numpy as np

from tftrt_py import settings
from tftrt_py.engine import layer_geometry
from tftrt_py.engine import layers as layer_kinds
from tftrt_py.engine.backends.cupy import _device
from tftrt_py.engine.network import Network

__all__ = ["MAX_ENGINE_BYTES_ENV", "MAX_ENGINE_WORK_ENV", "DEFAULT_MAX_WORK", "HOST_SHARE", "Limit", "Peak",
           "Work", "peak_memory", "declared_work", "host_memory", "max_engine_bytes", "engine_bytes_limit",
           "max_engine_work", "engine_work_limit", "size"]

logger = logging.getLogger(__name__)

#: Most bytes one engine may take (an integer; default: from the machine, see :func:`engine_bytes_limit`).
MAX_ENGINE_BYTES_ENV = settings.MAX_ENGINE_BYTES.name
#: Most work one engine may declare, in multiply-add equivalents (an integer; default DEFAULT_MAX_WORK).
MAX_ENGINE_WORK_ENV = settings.MAX_ENGINE_WORK.name
#: 2**47 (1.4e14) multiply-adds: about 18 minutes of BLAS on 2 CPU cores; ResNet-50 at batch 512 declares
#: 2.8e12, a 24-layer BERT-large at batch 64 and sequence 512 1.4e13 (tests/engine/test_budget.py).
DEFAULT_MAX_WORK = 2 ** 47
#: The share of the host's memory one engine may take: the rest holds TensorFlow, the caller's tensors and
#: other cached engines.
HOST_SHARE = 0.5

_CGROUP_LIMITS = ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes")


class Limit(NamedTuple):
    """A limit and where it comes from (said in errors)."""

    value: int
    source: str


class Peak(NamedTuple):
    """The most bytes a network holds at once: ``total`` = ``weights`` + ``live`` tensors + ``extra`` at
    ``where`` (the inputs, a layer, with its scratch as extra, or the end, with the caller's copies of the
    outputs as extra)."""

    total: int
    weights: int
    live: int
    extra: int
    where: str

    def describe(self) -> str:
        extra = "the caller's copies of the outputs" if self.where == _END else "scratch"
        return (f"at {self.where}: {size(self.live)} of live tensors, {size(self.extra)} of {extra} and "
                f"{size(self.weights)} of weights")


class Work(NamedTuple):
    """A network's declared work (multiply-add equivalents) and its heaviest layer's share."""

    total: int
    heaviest: str
    heaviest_work: int


_END = "the end"


def size(nbytes: int) -> str:
    """`nbytes` for people: bytes below 1 MiB, else MiB or GiB with one decimal."""
    if nbytes < 1 << 20:
        return f"{nbytes} bytes"
    return f"{nbytes / (1 << 20):.1f} MiB" if nbytes < 1 << 30 else f"{nbytes / (1 << 30):.1f} GiB"


def _bytes(t) -> int:
    return layer_geometry.volume(t.shape) * np.dtype(t.dtype).itemsize


def _last_reads(network: Network) -> Dict[str, int]:
    """Tensor name -> index of the last layer reading it; network outputs are read after the last layer."""
    last = {t.name: i for i, layer in enumerate(network.layers) for t in layer.inputs}
    last.update({t.name: len(network.layers) for t in network.outputs})
    return last


def peak_memory(network: Network) -> Peak:
    """The most bytes `network` holds at once when run layer by layer (see the module docstring)."""
    weights = sum(w.nbytes for layer in network.layers for w in layer.weights.values())
    last = _last_reads(network)
    live = sum(_bytes(t) for t in network.inputs)
    best = Peak(weights + live, weights, live, 0, "the inputs")
    for i, layer in enumerate(network.layers):
        spec = layer_kinds.get(layer.kind)
        live += sum(_bytes(t) for t in layer.outputs)
        scratch = spec.scratch(layer)
        if weights + live + scratch > best.total:
            best = Peak(weights + live + scratch, weights, live, scratch, f"layer {layer.name!r} ({layer.kind})")
        live -= sum(_bytes(t) for t in {t.name: t for t in layer.inputs}.values() if last.get(t.name) == i)
    copies = sum(_bytes(t) for t in network.outputs)
    if weights + live + copies > best.total:
        best = Peak(weights + live + copies, weights, live, copies, _END)
    return best


def declared_work(network: Network) -> Work:
    """The work `network`'s layers declare (their kinds' ``work``), and its heaviest layer."""
    total, heaviest, most = 0, "", -1
    for layer in network.layers:
        work = layer_kinds.get(layer.kind).work(layer)
        total += work
        if work > most:
            heaviest, most = f"layer {layer.name!r} ({layer.kind})", work
    return Work(total, heaviest, max(most, 0))


# -- limits ----------------------------------------------------------------------
def host_memory() -> int:
    """This host's physical memory, or the memory cgroup's limit where that is smaller."""
    sizes = [os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")]
    for path in _CGROUP_LIMITS:
        try:
            with open(path) as f:
                sizes.append(int(f.read().strip()))
        except (OSError, ValueError):  # no such cgroup file, or "max" (no limit)
            pass
    return min(sizes)


def _device_free() -> Optional[int]:
    """Bytes free on the current GPU (the driver's free memory plus what cupy's pool holds unused), or None
    without cupy or a GPU."""
    if not _device.probe()[0]:
        return None
    cupy = _device.require()
    return int(_device.free_and_total()[0]) + int(cupy.get_default_memory_pool().free_bytes())


def engine_bytes_limit(backend: str = "numpy") -> Limit:
    """The bytes one engine run by `backend` may take: MAX_ENGINE_BYTES_ENV when set, else the GPU's free memory
    for cupy engines where cupy sees a GPU, else HOST_SHARE of :func:`host_memory`."""
    value = settings.MAX_ENGINE_BYTES.get()
    if value is not None:
        return Limit(value, f"{MAX_ENGINE_BYTES_ENV}={value}")
    free = _device_free() if backend == "cupy" else None
    if free is not None:
        return Limit(free, "the GPU's free memory")
    host = host_memory()
    return Limit(int(host * HOST_SHARE), f"{HOST_SHARE:.0%} of this host's {size(host)}")


def max_engine_bytes(backend: str = "numpy") -> int:
    """The bytes one engine run by `backend` may take (see :func:`engine_bytes_limit`)."""
    return engine_bytes_limit(backend).value


def engine_work_limit() -> Limit:
    """The work one engine may declare: MAX_ENGINE_WORK_ENV when set, else DEFAULT_MAX_WORK."""
    value = settings.MAX_ENGINE_WORK.get()
    if value is not None:
        return Limit(value, f"{MAX_ENGINE_WORK_ENV}={value}")
    return Limit(DEFAULT_MAX_WORK, "the default")


def max_engine_work() -> int:
    """The work one engine may declare (see :func:`engine_work_limit`)."""
    return engine_work_limit().value
