"""The Triton compile process of triton.prefetch: reads a pickled list of requests on stdin, compiles them in
parallel worker processes and writes (request, artifacts or None, error or None) pickles to stdout as each
finishes. Run as ``python -m tftrt_py.engine.backends.cupy.triton.compile_worker`` (this module is the
``__main__`` its spawned workers import)."""
import concurrent.futures
import multiprocessing
import os
import pickle
import sys

from tftrt_py.engine.backends.cupy.triton import artifacts


def main() -> None:
    requests = pickle.load(sys.stdin.buffer)
    out = sys.stdout.buffer
    workers = max(1, min(len(requests), os.cpu_count() or 1, 16))
    with concurrent.futures.ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        jobs = {pool.submit(artifacts, r): r for r in requests}
        for job in concurrent.futures.as_completed(jobs):
            try:
                result, error = job.result(), None
            except Exception as exc:  # a kernel that does not compile: the build compiles it and reports why
                result, error = None, f"{type(exc).__name__}: {exc}"
            pickle.dump((jobs[job], result, error), out)
            out.flush()


if __name__ == "__main__":
    main()
