"""The Triton compile process of triton.prefetch: reads a JSON list of requests on stdin, compiles them in
parallel worker processes and writes one JSON line per kernel as each finishes: {"index": i, "artifacts":
[base64 cubin, entry name, warps, shared memory bytes, parameter count], "seconds": its compile time} or
{"index": i, "error": why}. Run as
``python -m tftrt_py.engine.backends.cupy.triton.compile_worker`` (this module is the ``__main__`` its workers
import)."""
import base64
import concurrent.futures
import json
import multiprocessing
import multiprocessing.forkserver
import os
import time

from tftrt_py import settings
from tftrt_py.engine.backends.cupy import helper_processes
from tftrt_py.engine.backends.cupy.triton import artifacts


def _timed_artifacts(request):
    start = time.perf_counter()
    return artifacts(request), time.perf_counter() - start


#: Modules the workers compile from, imported once by the fork server they are forked from rather than by each
#: worker (ResNet-50's 110 kernels on an H200 machine's 16 cores: the first answered 3.1 s after the process
#: started, against 4.1 s when two such processes' workers were spawned fresh and imported them themselves; a
#: kernel takes ~1.1 s).
PRELOAD = ["triton", "tftrt_py.engine.backends.cupy.triton.quantized_conv",
           "tftrt_py.engine.backends.cupy.triton.quantized_attention"]


def _context():
    """Workers forked from a fork server holding PRELOAD (no CUDA in it: compiling for a given target needs no
    GPU), or spawned where there is no fork server."""
    try:
        context = multiprocessing.get_context("forkserver")
    except ValueError:
        return multiprocessing.get_context("spawn")
    context.set_forkserver_preload(PRELOAD)
    return context


def main() -> None:
    os.nice(settings.COMPILE_NICENESS.get())  # the build this compiles ahead for comes first (its workers inherit it)
    answers = os.fdopen(os.dup(1), "w")  # the parent's pipe, kept for the answers alone (not inherited)
    os.dup2(2, 1)  # anything the workers or Triton print goes where stderr goes, never into an answer
    context = _context()
    if context.get_start_method() == "forkserver":
        multiprocessing.forkserver.ensure_running()  # (PRELOAD imported while the requests are not known yet)
    requests = helper_processes.wait_for_work()
    if not requests:
        return
    workers = max(1, min(len(requests), os.cpu_count() or 1, 16))
    with concurrent.futures.ProcessPoolExecutor(workers, mp_context=context) as pool:
        jobs = {pool.submit(_timed_artifacts, r): i for i, r in enumerate(requests)}
        for job in concurrent.futures.as_completed(jobs):
            try:
                (cubin, *rest), seconds = job.result()
                answer = {"index": jobs[job], "artifacts": [base64.b64encode(cubin).decode(), *rest],
                          "seconds": round(seconds, 3)}
            except Exception as exc:  # a kernel that does not compile: the build compiles it and reports why
                answer = {"index": jobs[job], "error": f"{type(exc).__name__}: {exc}"}
            answers.write(json.dumps(answer) + "\n")
            answers.flush()


if __name__ == "__main__":
    main()
