"""cuDNN's runtime-compiled plans, compiled ahead in other processes while INT8 calibration runs.

A plan of cuDNN's runtime fusion engine compiles CUDA code when built (NVRTC, then the driver's JIT to machine
code), and NVIDIA's Python frontend holds the GIL all along: built from threads here, the plans compile one at a
time and stall every other Python thread, calibration's too. The driver keeps what its JIT compiled in its
on-disk cache (``CUDA_CACHE_PATH``, shared by the processes of a user), and a plan built again in another
process takes its machine code from there: the FP16 ResNet-50 at batch 8 on an H200 built its candidates in 4.2 s
with a fresh driver cache and in 1.3 s with one another process had filled. So :func:`warm` builds the
convolutions' candidates in a few worker processes (this module as ``__main__``), each with its own GIL and CUDA
context, and the build that follows calibration finds most of its plans' machine code compiled. A calibrating
conversion starts them with the loading of its model (:func:`stand_by`, helper_processes.py), so their interpreters,
imports and CUDA contexts are ready when the specs are known.

A worker builds what a convolution's candidates build from its geometry, never from its values: weights of the layer's
shapes filled with ones, the quantized formats' scales as given (stand-ins while calibrating). It runs each candidate
once, so that the cupy kernels they launch (epilogues, im2col, channel padding), which cupy compiles at a first launch,
are in cupy's on-disk cache (``CUPY_CACHE_DIR``, shared like the driver's) when the build times them. Triton's kernels
are not its job (the Triton compile process has them). It answers with the runtime-compiled plans it built, serialized
by cuDNN (one JSON line each on its stdout: graph key, plan index, name, workspace, tensor uids, base64 data); they are
offered to this process's graphs (ops.conv.offer_plan), which load one in milliseconds where building it compiles again
(a ResNet-50 3x3 convolution's plan: 1.09 s built, 0.04 s deserialized in another process on an H200). The offers stay
in memory: a serialized plan holds machine code, so none is ever read from disk.
"""
from __future__ import annotations

import base64
import concurrent.futures
import json
import logging
import os
import subprocess
import sys
import time
from types import SimpleNamespace
from typing import List, Sequence

import numpy as np

from tftrt_py import settings
from tftrt_py.engine.backends.cupy import helper_processes

__all__ = ["describe", "stand_by", "warm", "answer", "parse_answer", "WORKERS", "WAIT_S"]

logger = logging.getLogger(__name__)

#: Worker processes at most (each a CUDA context and a cuDNN handle), and at most one per two CPUs and per
#: WORKER_BYTES of free device memory.
WORKERS = 8
WORKER_BYTES = 1 << 30
#: Seconds warm() waits for its workers before ending them.
WAIT_S = 120.0
#: Largest serialized plan taken from a worker (a runtime-compiled convolution's is about 72 KB).
MAX_PLAN_BYTES = 16 << 20
#: Layer kinds whose candidates include cuDNN runtime-compiled plans (ops/conv.py, ops/int8.py).
KINDS = ("Convolution",)


def _plain(value):
    """`value` as JSON (numpy scalars and arrays as Python numbers and lists)."""
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    raise TypeError(f"{type(value).__name__} is not JSON")


def describe(spec) -> dict:
    """What a worker needs to build `spec`'s candidates as the build will (a JSON-able dict)."""
    layer, o = spec.layer, spec.options
    return {"name": layer.name, "kind": layer.kind, "params": layer.params,
            "weights": {k: [list(v.shape), v.dtype.name] for k, v in layer.weights.items()},
            "out_range": layer.outputs[0].dynamic_range, "in_shapes": spec.in_shapes, "in_dtypes": spec.in_dtypes,
            "out_shapes": spec.out_shapes, "out_dtypes": spec.out_dtypes, "cdt": spec.cdt, "quant": spec.quant,
            "options": {"allow_tf32": o.allow_tf32, "max_workspace": o.max_workspace, "cudnn_plans": o.cudnn_plans,
                        "cudnn_runtime_plans": o.cudnn_runtime_plans, "strict_types": o.strict_types}}


def stand_by() -> None:
    """Start as many workers as warm() may use, ahead of it (helper_processes.stand_by), for a conversion that will
    calibrate; none where the driver's JIT cache is off."""
    if not settings.CUDA_CACHE_DISABLE.get():
        helper_processes.stand_by(__name__, _workers(WORKERS))


def _workers(jobs: int) -> int:
    """Worker processes for `jobs` specs: WORKERS at most, one per two CPUs and per WORKER_BYTES of free device
    memory."""
    return min(WORKERS, max(1, (os.cpu_count() or 2) // 2), jobs, _free_device_bytes() // WORKER_BYTES)


def warm(specs: Sequence) -> None:
    """Build the candidates of the convolutions among `specs` in worker processes, and wait for them (WAIT_S at
    most). Nothing happens where the driver's JIT cache is off (``CUDA_CACHE_DISABLE=1``): the workers' work would
    not outlive them. A worker that fails costs nothing but its time: the build compiles what it needs. The workers
    started ahead and not needed end."""
    todo: List[str] = []
    for spec in specs if not settings.CUDA_CACHE_DISABLE.get() else ():
        if spec.layer.kind not in KINDS:
            continue
        try:
            todo.append(json.dumps(describe(spec), default=_plain))
        except (TypeError, ValueError) as exc:
            logger.debug("%s: not warmed (%s)", spec.layer.name, exc)
    workers = _workers(len(todo)) if todo else 0
    if todo and workers < 1:
        logger.debug("cuDNN plans not built ahead: under %d bytes of device memory free", WORKER_BYTES)
    start = time.perf_counter()
    procs = []
    for i in range(workers):
        work = ("[" + ",".join(todo[i::workers]) + "]").encode()
        for _ in range(2):  # a helper that ended meanwhile (its pipe broken): the next one
            try:
                proc = helper_processes.take(__name__)
                helper_processes.give(proc, work)
            except OSError as exc:
                logger.debug("could not start a cuDNN warm-up process: %s", exc)
                continue
            procs.append(proc)
            break
    helper_processes.release(__name__)
    if not procs:
        return
    failed = 0
    with concurrent.futures.ThreadPoolExecutor(len(procs), "tftrt-cudnn-warmup") as readers:
        offers = [readers.submit(_collect, proc) for proc in procs]
        for proc in procs:
            try:
                failed += proc.wait(max(0.0, WAIT_S - (time.perf_counter() - start))) != 0
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                failed += 1
        offered = sum(f.result() for f in offers)
    logger.debug("cuDNN plans of %d layer spec(s) built ahead in %d process(es) in %.2f s, %d runtime-compiled plan(s) "
                 "offered%s", len(todo), len(procs), time.perf_counter() - start, offered,
                 f"; {failed} process(es) failed" if failed else "")


def _collect(proc) -> int:
    """Offer the plans a worker answers with (ops.conv.offer_plan) until it ends; how many. An answer that does not
    read as one ends the collection: the build compiles what was not offered."""
    from tftrt_py.engine.backends.cupy.ops import conv

    count = 0
    with proc.stdout:
        for line in proc.stdout:
            try:
                key, index, offer = parse_answer(line)
            except (ValueError, TypeError, KeyError) as exc:
                logger.debug("unreadable answer from a cuDNN warm-up process: %s", exc)
                break
            conv.offer_plan(key, index, offer)
            count += 1
    return count


def answer(key: str, index: int, offer) -> str:
    """One worker answer: plan `index` of the graph cached under `key` (a PlanOffer), as a JSON line."""
    return json.dumps({"key": key, "index": index, "name": offer.name, "workspace": offer.workspace,
                       "uids": offer.uids, "data": base64.b64encode(offer.data).decode()}) + "\n"


def parse_answer(line: bytes):
    """(key, plan index, PlanOffer) from an answer line, each field checked (ValueError, TypeError, KeyError)."""
    from tftrt_py.engine.backends.cupy.ops.conv import PlanOffer

    d = json.loads(line)
    key, index, name, workspace, uids = d["key"], d["index"], d["name"], d["workspace"], d["uids"]
    if not (isinstance(key, str) and isinstance(name, str) and type(index) is int and type(workspace) is int
            and isinstance(uids, dict) and all(isinstance(k, str) and type(v) is int for k, v in uids.items())):
        raise TypeError("an answer field has the wrong type")
    if index < 0 or workspace < 0 or len(d["data"]) > MAX_PLAN_BYTES * 4 // 3 + 4:
        raise ValueError(f"plan {index}: out of bounds (workspace {workspace}, {len(d['data'])} base64 characters)")
    return key, index, PlanOffer(name, workspace, uids, base64.b64decode(d["data"], validate=True))


def _free_device_bytes() -> int:
    """Free memory of the current GPU (0 where it cannot be read)."""
    try:
        from tftrt_py.engine.backends.cupy import _device

        return int(_device.require().cuda.runtime.memGetInfo()[0])
    except Exception:
        return 0


def _spec(d: dict, tuner):
    """The Spec `d` describes (describe()), with weights of ones."""
    from tftrt_py.engine.backends.cupy.ops.base import BuildOptions, Spec

    layer = SimpleNamespace(name=d["name"], kind=d["kind"], params=d["params"],
                            weights={k: np.ones(shape, dtype) for k, (shape, dtype) in d["weights"].items()},
                            outputs=[SimpleNamespace(dynamic_range=d["out_range"])])
    return Spec(layer, [tuple(s) for s in d["in_shapes"]], d["in_dtypes"], [tuple(s) for s in d["out_shapes"]],
                d["out_dtypes"], d["cdt"], BuildOptions(tuner=tuner, **d["options"]), quant=d["quant"])


def main() -> int:
    """Build the candidates of the specs read from stdin (describe()'s dicts, as a JSON list), cuDNN's plans among
    them (Triton is reported missing here), and run each once; answer each runtime-compiled plan built,
    serialized, as soon as it is."""
    from tftrt_py.engine.backends.cupy import triton
    from tftrt_py.engine.backends.cupy.context import RunContext
    from tftrt_py.engine.backends.cupy.ops import FACTORIES, conv

    os.nice(settings.COMPILE_NICENESS.get())  # calibration, running meanwhile, comes first
    answers = os.fdopen(os.dup(1), "w")  # the parent's pipe, kept for the answers alone
    os.dup2(2, 1)  # anything a library prints goes where stderr goes, never into an answer
    triton.available = lambda: False
    rc = RunContext(None)  # (the CUDA context, cuDNN's and cuBLAS's handles: made while the work is not known yet)
    specs = helper_processes.wait_for_work()
    if not specs:
        return 0
    failed, sent = 0, set()
    for d in specs:
        try:
            spec = _spec(d, rc)
            candidates = FACTORIES[d["kind"]](spec)
        except Exception:  # the build reports what does not build
            failed += 1
        else:
            _run_once(candidates, spec, rc)
        for key, index, graph in conv.built_runtime_plans():
            if (key, index) in sent:
                continue
            sent.add((key, index))
            try:
                answers.write(answer(key, index, graph.serialize(index)))
                answers.flush()
            except Exception:  # not serializable here: the build compiles it (its machine code is cached now)
                pass
    return 1 if failed == len(specs) else 0


def _run_once(candidates, spec, rc) -> None:
    """Run each of `candidates` once, on zeros: cupy compiles the kernels a candidate launches at their first launch
    (a quantized convolution's epilogue, its im2col...) into its on-disk cache, where the build's own first launches
    then find them. A candidate that fails to run is left to the build's timing, which drops it."""
    from tftrt_py.engine.backends.cupy import _device

    cupy = _device.require()
    try:
        ins = [cupy.zeros(tuple(s), d) for s, d in zip(spec.in_shapes, spec.in_dtypes)]
        outs = [cupy.empty(tuple(s), d) for s, d in zip(spec.out_shapes, spec.out_dtypes)]
        rc.ensure_workspace(max((c.workspace for c in candidates), default=0))
    except Exception:  # (out of memory: the build compiles them)
        return
    for op in candidates:
        try:
            with rc.stream:
                op.run(rc, ins, outs)
            rc.stream.synchronize()
        except Exception:
            pass


if __name__ == "__main__":
    sys.exit(main())
