"""Native replays: one execution context's engine, captured as one CUDA graph at fixed input shapes, described so
that code outside Python (the TRTEngineOp kernel) runs it without taking the GIL: copy each input into its pinned
buffer and on to the device, launch the graph, copy each output back into a page-locked block that becomes
TensorFlow's output tensor (the block returns to the kernel's pool when TensorFlow drops the tensor; while TensorFlow
holds every block, through the replay's own pinned buffer and a copy), synchronize.

TensorRT's op is C++ from end to end; ours serves through Python, which at batch 1 cost more than the engine
itself and serialised concurrent callers on the GIL. A backend offers a replay from its runner
(``native_replay``); the engine op hands it to the kernel, which keeps it for those input shapes. The kernel reads
``state`` before every run: 0 in ``state[ENABLED]`` (:meth:`Replay.revoke`) sends calls back to Python; it counts
its runs in ``state[RUNS]``, adds up where their time went in the ``TIMES`` slots (:meth:`Replay.times`) and counts
outputs handed over in pinned blocks and outputs copied (:meth:`Replay.outputs_handed`). ``keep`` holds everything
the addresses point into; the kernel owns a reference to it for as long as it keeps the replay.

The layout of :meth:`Replay.pack` is the kernel's protocol (``ParseReplay`` in engine_op/kernel.cc).
"""
from __future__ import annotations

import dataclasses
from typing import List, Sequence, Tuple

import numpy as np

__all__ = ["Buffer", "Functions", "Replay", "VERSION", "ENABLED", "RUNS", "TIMES", "HANDED", "COPIED",
           "mean_times"]

VERSION = 2
ENABLED, RUNS = 0, 1  # slots of Replay.state
#: Replay.state slots 2-5: nanoseconds summed over the runs, by step
TIMES = ("copy_in", "device", "copy_out", "kernel")
#: Replay.state slots: outputs handed to TensorFlow in pinned blocks, outputs copied into TensorFlow's memory
HANDED, COPIED = 2 + len(TIMES), 3 + len(TIMES)


@dataclasses.dataclass(frozen=True)
class Functions:
    """Addresses of C functions with the CUDA driver API's signatures (each returns 0 on success)."""

    set_context: int  # cuCtxSetCurrent(context)
    to_device: int  # cuMemcpyHtoDAsync(device, host, nbytes, stream)
    to_host: int  # cuMemcpyDtoHAsync(host, device, nbytes, stream)
    launch: int  # cuGraphLaunch(graph, stream)
    synchronize: int  # cuStreamSynchronize(stream)
    host_alloc: int  # cuMemHostAlloc(&host, nbytes, flags)
    host_free: int  # cuMemFreeHost(host)

    def addresses(self) -> List[int]:
        return [self.set_context, self.to_device, self.to_host, self.launch, self.synchronize, self.host_alloc,
                self.host_free]


@dataclasses.dataclass(frozen=True)
class Buffer:
    """One binding: `nbytes` bytes at `pinned` (host, page-locked) and at `device`; `shape` for outputs."""

    nbytes: int
    pinned: int
    device: int
    shape: Tuple[int, ...] = ()


@dataclasses.dataclass(eq=False)  # compared and hashed by identity (kept in weak sets)
class Replay:
    """A captured engine at fixed shapes; inputs and outputs in the engine's binding order."""

    functions: Functions
    context: int
    stream: int
    graph: int
    inputs: Sequence[Buffer]
    outputs: Sequence[Buffer]
    keep: object  # owns the memory and handles the addresses point into
    limit: int = 1  # replays the kernel may hold for these shapes (the engine's execution contexts)
    state: np.ndarray = dataclasses.field(default_factory=lambda: np.array([1, 0] + [0] * (len(TIMES) + 2),
                                                                           np.int64))

    def pack(self) -> List[int]:
        """[VERSION, 7 function addresses, context, stream, graph, address of state, limit,
        n_in, (nbytes, pinned, device) per input, n_out, (nbytes, pinned, device, rank, *dims) per output]."""
        packed = [VERSION, *self.functions.addresses(), self.context, self.stream, self.graph,
                  self.state.ctypes.data, self.limit, len(self.inputs)]
        for b in self.inputs:
            packed += [b.nbytes, b.pinned, b.device]
        packed.append(len(self.outputs))
        for b in self.outputs:
            packed += [b.nbytes, b.pinned, b.device, len(b.shape), *b.shape]
        return packed

    def revoke(self) -> None:
        """Send the kernel's calls for these shapes back to Python (it drops the replay at its next Python call)."""
        self.state[ENABLED] = 0

    @property
    def runs(self) -> int:
        """Runs the kernel made of this replay."""
        return int(self.state[RUNS])

    def times(self) -> dict:
        """Mean microseconds per run, by step (see :func:`mean_times`)."""
        return mean_times([self.state])

    def outputs_handed(self) -> Tuple[int, int]:
        """(outputs the kernel handed to TensorFlow in pinned blocks, outputs it copied into TensorFlow's memory)."""
        return int(self.state[HANDED]), int(self.state[COPIED])


def mean_times(states: Sequence[np.ndarray]) -> dict:
    """Mean microseconds per run over replays' `states`: ``copy_in`` (inputs into pinned memory, DMAs queued),
    ``device`` (until the stream is done: DMAs, graph, copies back), ``copy_out`` (handing the outputs to TensorFlow,
    copying those that could not land in a pinned block) and
    ``kernel`` (the whole kernel call, from TensorFlow's entry to its end)."""
    runs = max(sum(int(s[RUNS]) for s in states), 1)
    return {name: sum(float(s[2 + i]) for s in states) / runs / 1e3 for i, name in enumerate(TIMES)}
