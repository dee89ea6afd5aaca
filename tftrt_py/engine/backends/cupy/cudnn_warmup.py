"""cuDNN's runtime-compiled plans, compiled ahead in other processes while INT8 calibration runs.

A plan of cuDNN's runtime fusion engine compiles CUDA code when built (NVRTC, then the driver's JIT to machine
code), and NVIDIA's Python frontend holds the GIL all along: built from threads here, the plans compile one at a
time and stall every other Python thread, calibration's too. The driver keeps what its JIT compiled in its
on-disk cache (``CUDA_CACHE_PATH``, shared by the processes of a user), and a plan built again in another
process takes its machine code from there: the FP16 ResNet-50 at batch 8 on an H200 built its candidates in 4.2 s
with a fresh driver cache and in 1.3 s with one another process had filled. So :func:`warm` builds the
convolutions' candidates in a few worker processes (this module as ``__main__``), each with its own GIL and CUDA
context, and the build that follows calibration finds most of its plans' machine code compiled.

A worker builds what a convolution's candidates build from its geometry, never from its values: weights of the
layer's shapes filled with ones, the quantized formats' scales as given (stand-ins while calibrating). Triton's
kernels are not its job (the Triton compile process has them). Nothing comes back but the exit status.
"""
from __future__ import annotations

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

__all__ = ["describe", "warm", "WORKERS", "WAIT_S"]

logger = logging.getLogger(__name__)

#: Worker processes at most (each a CUDA context and a cuDNN handle), and at most one per two CPUs and per
#: WORKER_BYTES of free device memory.
WORKERS = 8
WORKER_BYTES = 1 << 30
#: Seconds warm() waits for its workers before ending them.
WAIT_S = 120.0
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


def warm(specs: Sequence) -> None:
    """Build the candidates of the convolutions among `specs` in worker processes, and wait for them (WAIT_S at
    most). Nothing happens where the driver's JIT cache is off (``CUDA_CACHE_DISABLE=1``): the workers' work would
    not outlive them. A worker that fails costs nothing but its time: the build compiles what it needs."""
    if settings.CUDA_CACHE_DISABLE.get():
        return
    todo: List[str] = []
    for spec in specs:
        if spec.layer.kind not in KINDS:
            continue
        try:
            todo.append(json.dumps(describe(spec), default=_plain))
        except (TypeError, ValueError) as exc:
            logger.debug("%s: not warmed (%s)", spec.layer.name, exc)
    if not todo:
        return
    workers = min(WORKERS, max(1, (os.cpu_count() or 2) // 2), len(todo), _free_device_bytes() // WORKER_BYTES)
    if workers < 1:
        logger.debug("cuDNN plans not built ahead: under %d bytes of device memory free", WORKER_BYTES)
        return
    start = time.perf_counter()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))  # this process's imports
    procs = []
    for i in range(workers):
        try:
            proc = subprocess.Popen([sys.executable, "-m", __name__], stdin=subprocess.PIPE,
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
            proc.stdin.write(("[" + ",".join(todo[i::workers]) + "]").encode())
            proc.stdin.close()
            procs.append(proc)
        except OSError as exc:
            logger.debug("could not start a cuDNN warm-up process: %s", exc)
    failed = 0
    for proc in procs:
        try:
            failed += proc.wait(max(0.0, WAIT_S - (time.perf_counter() - start))) != 0
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            failed += 1
    logger.debug("cuDNN plans of %d layer spec(s) built ahead in %d process(es) in %.2f s%s", len(todo), len(procs),
                 time.perf_counter() - start, f"; {failed} process(es) failed" if failed else "")


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
    """Build the candidates of the specs read from stdin (describe()'s dicts, as a JSON list): cuDNN's plans only
    (Triton is reported missing here)."""
    from tftrt_py.engine.backends.cupy import triton
    from tftrt_py.engine.backends.cupy.context import RunContext
    from tftrt_py.engine.backends.cupy.ops import FACTORIES

    triton.available = lambda: False
    specs = json.load(sys.stdin)
    tuner = RunContext(None)
    failed = 0
    for d in specs:
        try:
            FACTORIES[d["kind"]](_spec(d, tuner))
        except Exception:  # the build reports what does not build
            failed += 1
    return 1 if failed == len(specs) else 0


if __name__ == "__main__":
    sys.exit(main())
