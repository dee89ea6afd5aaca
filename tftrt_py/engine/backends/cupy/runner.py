"""Running a program in one execution context: its own stream, handles, workspace, activation arena
and binding buffers; the whole engine captured as CUDA graphs on the first run and replayed after.
Host arrays travel through per-context pinned buffers, copied asynchronously on the context's stream
(see staging).

Steps that synchronize with the host (TopK, NMS) split the engine into several graphs with those
steps run eagerly between them. If capture fails the context logs it once and runs eagerly.

Device arrays of an engine that is one graph run on the caller's stream, as TensorRT's enqueue does: its input
copies and the graph join the caller's work with no waits between streams. Arrays at the addresses the call before
also passed (a caller reusing its buffers) are read where they are, by a graph captured for those addresses, as
TensorRT reads the buffers it is given; others are copied into the binding buffers. A run on another stream than the
last one's waits for all that stream was given until then (the last run and whatever read its outputs), and the
context's own stream waits for each run on a caller's stream (a native replay, run outside Python, follows it).
"""
from __future__ import annotations

import collections
import logging
import threading
import time
import weakref
from typing import Dict, Mapping, Optional

import numpy as np

from tftrt_py import settings
from tftrt_py.engine.backends import base
from tftrt_py.engine.backends.cupy import _device, staging
from tftrt_py.engine.backends.cupy.context import RunContext
from tftrt_py.engine.backends.cupy.memory import OutOfGpuMemory
from tftrt_py.engine.backends.cupy.program import Program
from tftrt_py.engine.backends.cupy.tactics import CAPTURE_LOCK, capture
from tftrt_py.engine.errors import RuntimeExecutionError
from tftrt_py.engine.replay import Buffer, Functions, Replay

__all__ = ["Runner"]

logger = logging.getLogger(__name__)

#: Captures tried before a context runs eagerly: an invalidated capture (seen with other contexts running
#: concurrently, cause not found) usually succeeds when tried again.
CAPTURE_ATTEMPTS = 3
#: Graphs a context keeps that read device inputs where they are (one per set of input addresses, the least
#: recently used dropped): a caller cycling through a few buffers of its own.
BOUND_GRAPHS = 4


class Runner(base.Runner):
    """Executes one engine's program for one ExecutionContext (one thread at a time)."""

    replays = True

    def __init__(self, engine, program: Program):
        cupy = _device.require()
        self.engine, self.program = engine, program
        ledger = program.ledger
        self.lock = threading.Lock()
        with CAPTURE_LOCK:  # handle creation and allocation must not meet another thread's capture
            self._setup(cupy, ledger, program)
        self._finalizer = weakref.finalize(self, _refund, ledger, list(self._charged), self.rc)
        self.steps = [(s, [self.views[n] for n in s.inputs], [self.views[n] for n in s.outputs])
                      for s in program.steps]
        self.segments: Optional[list] = None
        self._step_graphs: Dict[int, tuple] = {}  # profiling: step index -> (graph, the memory it keeps)
        self.capture = program.capture
        self._pinned: Optional[Dict[str, np.ndarray]] = None
        self._last = None  # the stream this context's last run went to (kept alive here)
        self._ran = cupy.cuda.Event(disable_timing=True)  # recorded after each run on a caller's stream
        self._input_slots = [dict(program.inputs)[t.name] for t in engine.inputs]  # binding buffers, in input order
        self._device_key = None  # the (shape, dtype) of each device input of the last checked call
        self._device_rows: Optional[int] = None  # its rows, when fewer than a row-wise engine's batch
        #: Input addresses -> (graph reading the arrays there, the memory it keeps); the last call's addresses.
        self._bound: "collections.OrderedDict[tuple, tuple]" = collections.OrderedDict()
        self._last_addresses: Optional[tuple] = None

    def _setup(self, cupy, ledger, program) -> None:
        self.rc, self._charged = None, []
        try:
            self.rc = RunContext(ledger, cudnn=program.needs_cudnn, workspace=program.workspace_bytes)
            self._arena = ledger.alloc("activations", program.arena_bytes)
            self._charged.append(("activations", max(program.arena_bytes, 1)))
            self.views: Dict[str, object] = {}
            for slot in program.slots.values():
                if slot.place in ("input", "output"):
                    mem = ledger.alloc("io", slot.nbytes)
                    self._charged.append(("io", max(slot.nbytes, 1)))
                    self.views[slot.name] = cupy.ndarray(slot.shape, slot.dtype, mem)
                elif slot.place == "arena":
                    self.views[slot.name] = cupy.ndarray(slot.shape, slot.dtype, self._arena + slot.offset)
                elif slot.place == "const":
                    self.views[slot.name] = slot.array
        except BaseException as exc:  # a context that cannot be made gives back what it took
            for kind, nbytes in self._charged:
                ledger.release(kind, nbytes)
            if self.rc is not None:
                self.rc.close()
            if isinstance(exc, OutOfGpuMemory):
                raise RuntimeExecutionError(str(exc)) from exc
            raise
        for slot in program.slots.values():
            if slot.place == "alias":
                self.views[slot.name] = self._view(slot.name)
        if settings.POISON.get():  # NaN bytes everywhere: unwritten outputs show up
            with self.rc.stream:
                for mem, nbytes in [(self._arena, program.arena_bytes)] + [
                        (self.views[s.name].data, s.nbytes) for s in program.slots.values()
                        if s.place in ("input", "output")]:
                    cupy.ndarray((max(nbytes, 1),), cupy.uint8, mem).fill(255)
                if self.rc.workspace is not None:
                    self.rc.workspace.fill(255)
            self.rc.stream.synchronize()

    def _view(self, name: str):
        slot = self.program.slots[name]
        if slot.place != "alias":
            return self.views[name]
        return self._view(slot.base).reshape(slot.shape)

    # -- execution -------------------------------------------------------------------------------------
    def _run_eager(self, profiler=None) -> None:
        cupy = _device.require()
        rc = self.rc
        events = []
        with rc.stream:
            for i, (step, ins, outs) in enumerate(self.steps):
                if profiler is None:
                    step.op.run(rc, ins, outs)
                    continue
                run = self._step_graph(i) if self.capture and step.op.capturable else None
                start, end = cupy.cuda.Event(), cupy.cuda.Event()
                start.record(rc.stream)
                if run is not None:
                    run.launch(rc.stream)
                else:
                    step.op.run(rc, ins, outs)
                end.record(rc.stream)
                events.append((step.layer, start, end))
        if profiler is not None:
            rc.stream.synchronize()
            for layer, start, end in events:
                profiler.report_layer_time(layer, cupy.cuda.get_elapsed_time(start, end))

    def _step_graph(self, i: int):
        """Step `i` alone as a CUDA graph (made on the first profiled run): the profiler then times its GPU work
        without the gaps between the kernels a step launches from Python."""
        if i not in self._step_graphs:
            step, ins, outs = self.steps[i]
            with CAPTURE_LOCK:
                self._step_graphs[i] = capture(self.rc.stream, lambda: step.op.run(self.rc, ins, outs))
        return self._step_graphs[i][0]

    def _capture(self) -> None:
        """Group the steps into captured graphs (capturable runs) and eager steps."""
        segments, run = [], []

        def flush():
            if run:
                steps = list(run)
                graph, keep = capture(self.rc.stream, lambda: [s.op.run(self.rc, i, o) for s, i, o in steps])
                segments.append(("graph", graph, keep))
                run.clear()

        for item in self.steps:
            if item[0].op.capturable:
                run.append(item)
            else:
                flush()
                segments.append(("eager", item, None))
        flush()
        self.segments = segments

    def _run(self, profiler=None) -> None:
        if profiler is not None or not self.capture:
            self._run_eager(profiler)
            return
        if self.segments is None:
            with CAPTURE_LOCK:
                self._run_eager()  # the first run warms every kernel up (compiles, loads modules)
                self.rc.stream.synchronize()
                for attempt in range(CAPTURE_ATTEMPTS):
                    try:
                        self._capture()
                        return
                    except Exception as exc:  # seen: CUDA_ERROR_STREAM_CAPTURE_INVALIDATED under concurrent load
                        failure = exc
                        logger.info("CUDA-graph capture of engine %r failed (attempt %d: %s)", self.engine.name,
                                    attempt + 1, exc)
                        time.sleep(0.001 * (attempt + 1))
                logger.warning("CUDA-graph capture of engine %r failed %d times (%s); this context runs it eagerly",
                               self.engine.name, CAPTURE_ATTEMPTS, failure)
                self.capture = False
            return
        with self.rc.stream:
            for kind, item, _ in self.segments:
                if kind == "graph":
                    item.launch(self.rc.stream)
                else:
                    step, ins, outs = item
                    step.op.run(self.rc, ins, outs)

    def _single_graph(self):
        """The engine's one CUDA graph, once captured; None while it runs eagerly or in several segments."""
        if self.capture and self.segments is not None and len(self.segments) == 1 and self.segments[0][0] == "graph":
            return self.segments[0][1]
        return None

    def _follow(self, stream) -> None:
        """Order `stream` after this context's last run and all its stream was given since; `stream` runs next."""
        if self._last is not None and self._last.ptr != stream.ptr:
            stream.wait_event(self._last.record())
        self._last = stream

    def _check_shapes(self, shapes: Mapping[str, tuple]) -> None:
        for binding, slot in self.program.inputs:
            want = self.views[slot].shape
            if tuple(shapes[binding]) != tuple(want):
                raise RuntimeExecutionError(
                    f"the cupy backend runs engine {self.engine.name!r} at the shapes it was built for; input "
                    f"{binding!r} has shape {list(shapes[binding])}, the engine {list(want)}: build an engine "
                    f"for these shapes")

    def _guarded(self, fn):
        try:
            return fn()
        except RuntimeExecutionError:
            raise
        except Exception as exc:
            if _device.is_out_of_memory(exc):
                err = self.program.ledger.out_of_memory("run-time temporaries", 0)
                raise RuntimeExecutionError(str(err)) from exc
            raise RuntimeExecutionError(f"engine {self.engine.name!r} failed on the GPU: {exc}") from exc

    # -- host bindings (ExecutionContext.execute) -------------------------------------------------------
    def execute(self, ctx, bindings: Mapping[str, np.ndarray], outputs=None) -> Dict[str, np.ndarray]:
        """Run on host arrays: each input copied once into this context's pinned buffer and from there to the
        device (both in chunks that overlap, see staging), each output back through pinned memory into
        ``outputs(index, shape)`` (TensorFlow's output tensors, when TRTEngineOp runs it) or a new array.

        A smaller batch of a row-wise engine moves only its rows; the rows after them keep whatever the last
        run left (rows are independent), as for device arrays.
        """
        if any(_is_device_array(v) for v in bindings.values()):
            return self.execute_device(bindings, profiler=ctx.profiler)
        with self.lock:
            values, batch = ctx._check_inputs(bindings, pad=False)
            eng = self.engine
            partial = batch is not None and eng.rowwise and batch < eng.max_batch_size
            self._check_shapes({k: (eng.max_batch_size,) + v.shape[1:] if partial else v.shape
                                for k, v in values.items()})

            def go():
                staged = self._staging()
                stream = self.rc.stream
                self._follow(stream)
                rows = _first_rows(batch if partial else None)
                for binding, slot in self.program.inputs:
                    staging.to_device(values[binding], rows(staged[slot]), rows(self.views[slot]), stream)
                self._run(ctx.profiler)
                for binding, slot in self.program.outputs:
                    rows(self.views[slot]).get(stream=stream, out=rows(staged[slot]))
                stream.synchronize()
                return {binding: staging.from_pinned(rows(staged[slot]), i, outputs)
                        for i, (binding, slot) in enumerate(self.program.outputs)}

            return self._guarded(go)

    def _staging(self) -> Dict[str, np.ndarray]:
        """Pinned host buffers for the input and output bindings (made on the first host run, kept for the
        context's life): copies from pinned memory run asynchronously on the context's stream."""
        if self._pinned is None:
            cupy = _device.require()
            pinned = {}
            for _, slot in self.program.inputs + self.program.outputs:
                s = self.program.slots[slot]
                mem = cupy.cuda.alloc_pinned_memory(max(s.nbytes, 1))
                pinned[slot] = np.ndarray(s.shape, s.dtype, buffer=mem)
            self._pinned = pinned
        return self._pinned

    def native_replay(self, ctx, arrays, out_dtypes):
        """A :class:`~tftrt_py.engine.replay.Replay` of this context at the shapes of host `arrays` (engine input
        order), for the TRTEngineOp kernel to run without Python; None when the engine is not one CUDA graph
        (steps that synchronize with the host, a failed capture), its output dtypes differ from `out_dtypes`, or
        the driver's calls are missing. Runs the engine twice on `arrays` first (the first run captures)."""
        eng = self.engine
        bindings = {t.name: a for t, a in zip(eng.inputs, arrays)}
        for _ in range(2):
            self.execute(ctx, bindings)
        found = _device.driver()
        graph = self._single_graph()
        if found is None or graph is None or len(arrays) != len(eng.inputs):
            return None
        values, batch = ctx._check_inputs(bindings, pad=False)
        rows = _first_rows(batch if batch is not None and eng.rowwise and batch < eng.max_batch_size else None)
        staged, slots = self._staging(), dict(self.program.inputs + self.program.outputs)
        inputs = []
        for t in eng.inputs:
            pinned, device = rows(staged[slots[t.name]]), rows(self.views[slots[t.name]])
            if pinned.nbytes != values[t.name].nbytes:
                return None
            inputs.append(Buffer(pinned.nbytes, pinned.ctypes.data, device.data.ptr))
        outputs = []
        for t, dtype in zip(eng.outputs, out_dtypes):
            pinned, device = rows(staged[slots[t.name]]), rows(self.views[slots[t.name]])
            if pinned.dtype != dtype or not device.flags.c_contiguous:
                return None
            outputs.append(Buffer(pinned.nbytes, pinned.ctypes.data, device.data.ptr, tuple(pinned.shape)))
        context = _device.current_context()
        if not graph.graphExec or not context:
            return None
        return Replay(Functions(*found[1]), context, self.rc.stream.ptr, graph.graphExec, inputs, outputs, keep=ctx)

    # -- device bindings --------------------------------------------------------------------------------
    def execute_device(self, bindings: Mapping[str, object], profiler=None) -> Dict[str, object]:
        """Run on cupy arrays; ordered after the caller's current stream and before its later work. Returns
        this context's output buffers (overwritten by its next run), their first rows for a smaller batch.

        The inputs' shapes and dtypes are checked when they differ from the last call's (a call's usual case
        costs no checks). Inputs at the addresses of the call before are read where they are (_bound_graph): as with
        TensorRT, work on another stream must not write them until the run is done (work after the call on the
        caller's stream runs after it). Others reach their binding buffers by one device-to-device memcpy each
        (ResNet-50's fp32 images at batch 128: 0.04 ms on an H200)."""
        cupy = _device.require()
        eng = self.engine
        with self.lock:
            try:
                arrays = [bindings[t.name] for t in eng.inputs]
            except KeyError:
                missing = [t.name for t in eng.inputs if t.name not in bindings]
                raise RuntimeExecutionError(f"missing input bindings {missing}; engine inputs are "
                                            f"{[t.name for t in eng.inputs]}") from None
            key = tuple((a.shape, a.dtype) for a in arrays)
            if key != self._device_key:
                self._device_rows = self._check_device_inputs(arrays)
                self._device_key = key
            rows = self._device_rows

            def go():
                caller = cupy.cuda.get_current_stream()
                graph = self._single_graph() if profiler is None else None
                stream = caller if graph is not None else self.rc.stream
                self._follow(stream)
                if stream is not caller:  # the inputs come from the caller's stream
                    stream.wait_event(caller.record())
                bound = self._bound_graph(cupy, arrays) if graph is not None and rows is None else None
                if bound is not None:
                    bound.launch(stream)
                    return self._outputs(rows, stream, caller)
                for slot, src in zip(self._input_slots, arrays):
                    dst = self.views[slot]
                    _copy_device(cupy, dst[:src.shape[0]] if src.shape != dst.shape else dst, src, stream)
                if graph is not None:
                    graph.launch(stream)
                else:
                    self._run(profiler)
                return self._outputs(rows, stream, caller)

            return self._guarded(go)

    def _outputs(self, rows: Optional[int], stream, caller) -> Dict[str, object]:
        """The output buffers of a run just enqueued on `stream` (their first `rows`), the streams joined."""
        result = {}
        for binding, slot in self.program.outputs:
            result[binding] = self.views[slot][:rows] if rows is not None else self.views[slot]
        if stream is caller:
            self.rc.stream.wait_event(caller.record(self._ran))
        else:
            caller.wait_event(stream.record())
        return result

    def _bound_graph(self, cupy, arrays):
        """The engine's graph reading `arrays` where they are, or None (they are then copied). Captured for
        addresses the call before passed too, unless an array is not a contiguous one of this device or overlaps
        this context's memory (an output of its own fed back, which the run overwrites)."""
        key = tuple(a.data.ptr if isinstance(a, cupy.ndarray) else None for a in arrays)
        found = self._bound.get(key)
        if found is not None:
            self._bound.move_to_end(key)
            return found[0]
        last, self._last_addresses = self._last_addresses, key
        if key != last or not all(self._readable_in_place(cupy, a) for a in arrays):
            return None
        steps = self._steps_reading(arrays)
        if steps is None:
            return None
        try:
            self._bound[key] = capture(self.rc.stream, lambda: [s.op.run(self.rc, i, o) for s, i, o in steps])
        except Exception as exc:  # the copies serve; the next repeat of these addresses tries again
            logger.info("capturing engine %r for its callers' input buffers failed: %s", self.engine.name, exc)
            return None
        if len(self._bound) > BOUND_GRAPHS:
            self._bound.popitem(last=False)
        return self._bound[key][0]

    def _readable_in_place(self, cupy, a) -> bool:
        if not (isinstance(a, cupy.ndarray) and a.flags.c_contiguous and a.data.device_id == self._arena.device_id):
            return False
        start, end = a.data.ptr, a.data.ptr + a.nbytes
        own = [(self._arena.ptr, self.program.arena_bytes)] + [
            (self.views[s.name].data.ptr, s.nbytes) for s in self.program.slots.values() if s.place == "output"]
        return all(end <= ptr or start >= ptr + nbytes for ptr, nbytes in own)

    def _steps_reading(self, arrays) -> Optional[list]:
        """The steps with the input bindings (and views of them) replaced by `arrays`; None if a step writes one."""
        slots, views = self.program.slots, dict(self.views)
        views.update(zip(self._input_slots, arrays))

        def view(name):
            slot = slots[name]
            return view(slot.base).reshape(slot.shape) if slot.place == "alias" else views[name]

        inputs = set(self._input_slots)
        if any(self.program.root(n).name in inputs for s in self.program.steps for n in s.outputs):
            return None
        return [(s, [view(n) for n in s.inputs], [view(n) for n in s.outputs]) for s in self.program.steps]

    def _check_device_inputs(self, arrays) -> Optional[int]:
        """Checks device inputs (engine input order) against the engine; the rows of a smaller batch of a
        row-wise engine, else None."""
        eng = self.engine
        for t, a in zip(eng.inputs, arrays):
            if a.dtype != t.dtype:
                raise RuntimeExecutionError(f"input {t.name!r} has dtype {a.dtype.name}, the engine expects "
                                            f"{t.dtype}")
        shapes = [tuple(a.shape) for a in arrays]
        if not eng.can_serve(shapes):
            raise RuntimeExecutionError(f"input shapes {[list(s) for s in shapes]} cannot be served by this "
                                        f"engine, built for {[list(t.shape) for t in eng.inputs]}")
        self._check_shapes({t.name: (t.shape[0],) + s[1:] if (s and t.shape and s[0] < t.shape[0]) else s
                            for t, s in zip(eng.inputs, shapes)})
        batch = shapes[0][0] if shapes and shapes[0] else None
        return batch if batch is not None and eng.rowwise and batch < eng.max_batch_size else None

    def close(self) -> None:
        self.segments = None
        self._step_graphs.clear()
        self._bound.clear()
        self._finalizer()


def _refund(ledger, charged, rc) -> None:
    for kind, nbytes in charged:
        ledger.release(kind, nbytes)
    rc.close()


def _first_rows(batch: Optional[int]):
    """A function giving an array's first `batch` rows (the whole array for None)."""
    return (lambda a: a) if batch is None else (lambda a: a[:batch])


def _copy_device(cupy, dst, src, stream) -> None:
    """`src` into the binding buffer `dst` (same shape and dtype) on `stream`: one memcpy where both are
    contiguous cupy arrays on the current device (cupy.copyto's own checks cost several microseconds a call),
    else cupy.copyto."""
    if isinstance(src, cupy.ndarray) and src.flags.c_contiguous and dst.flags.c_contiguous and \
            src.data.device_id == dst.data.device_id:
        dst.data.copy_from_device_async(src.data, src.nbytes, stream)
        return
    with stream:
        cupy.copyto(dst, src)


def _is_device_array(value) -> bool:
    return hasattr(value, "__cuda_array_interface__") and not isinstance(value, np.ndarray)
