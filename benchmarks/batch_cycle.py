"""The model process's cost of one batch, without clients or front ends: what bounds tftrt-serve's batched
throughput when the front ends keep up.

    python benchmarks/batch_cycle.py [--model thin_224|small_cnn|resnet50] [--batch 32] [--batches 60]
                                     [--workdir DIR]

The model is exported and converted as benchmarks/serve_load.py does it (same --workdir reuse). Each single-row
request is written into a shared-memory arena and read back as a view, as a front-end worker's request reaches the
model process; `--batch` of them are submitted to a BatchScheduler (one batch thread, max_batch_size --batch) and
their answers awaited, --batches times. Printed, medians over the batches after the first 10: submit (the caller's
thread, in the server a worker's reader: checks, and the rows' copy into their batch), run (from the
last submit to the last answer: the batch thread's work on a full batch), Signature.run on the batch merged
beforehand into one aligned array (the conversion to a tensor and the call), and the process's CPU time per
request.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.dirname(HERE), HERE]

import numpy as np  # noqa: E402

from serve_load import MODEL_NAME, SIZES, convert  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=sorted(SIZES), default="thin_224")
    p.add_argument("--batch", type=int, default=32, help="requests per batch, one row each (default: 32)")
    p.add_argument("--batches", type=int, default=60, help="batches run (default: 60)")
    p.add_argument("--workdir", help="keep the converted model here, and reuse a conversion found there")
    args = p.parse_args()

    from tftrt_py.serving import BatchingOptions, ModelSpec
    from tftrt_py.serving.batch_buffers import aligned_empty
    from tftrt_py.serving.models import ModelManager
    from tftrt_py.serving.service import Service
    from tftrt_py.serving.shared_tensors import Arena

    root = args.workdir or tempfile.mkdtemp(prefix="batch_cycle_")
    convert(args.model, root, [1, args.batch])
    service = Service(ModelManager([ModelSpec(MODEL_NAME, os.path.join(root, MODEL_NAME))]),
                      BatchingOptions(max_batch_size=args.batch, batch_timeout_micros=10_000_000, num_batch_threads=1))
    try:
        service.manager.load()
        servable = service.manager.servable(MODEL_NAME)
        signature = servable.signature("serving_default")
        (name,) = signature.inputs
        size = SIZES[args.model]
        rng = np.random.default_rng(0)
        rows = [rng.standard_normal((1, size, size, 3), np.float32) for _ in range(args.batch)]
        arena = Arena(2 * sum(r.nbytes for r in rows) + (1 << 20))
        requests = [arena.read(arena.write({name: r})[1]) for r in rows]
        submit, run = [], []
        cpu = time.process_time()
        for _ in range(args.batches):
            start = time.perf_counter()
            futures = [service.submit(servable, signature, r) for r in requests]
            submitted = time.perf_counter()
            answers = [f.result() for f in futures]
            submit.append(submitted - start)
            run.append(time.perf_counter() - submitted)
        cpu = time.process_time() - cpu
        merged = aligned_empty((args.batch, size, size, 3), np.float32)
        np.concatenate(rows, out=merged)
        whole = signature.run({name: merged})
        for i, answer in enumerate(answers):  # each request got its row's answer
            for key, value in answer.items():
                np.testing.assert_allclose(value, whole[key][i:i + 1], rtol=1e-5, atol=1e-6)
        calls = []
        for _ in range(20):
            start = time.perf_counter()
            signature.run({name: merged})
            calls.append(time.perf_counter() - start)
    finally:
        service.close()
    print(f"{args.model}, {args.batch} requests of {rows[0].nbytes / 1e3:.0f} KB per batch, medians of "
          f"{len(submit) - 10} batches:")
    print(f"  submit (caller's thread)          {np.median(submit[10:]) * 1e3:8.2f} ms")
    print(f"  run (batch thread, full batch)    {np.median(run[10:]) * 1e3:8.2f} ms")
    print(f"  Signature.run on the merged batch {np.median(calls[5:]) * 1e3:8.2f} ms")
    print(f"  process CPU per request           {cpu / (args.batches * args.batch) * 1e3:8.3f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
