"""What reading a large output with ``.numpy()`` costs, with glibc's default malloc settings and with freed memory
kept for reuse.

    python benchmarks/output_copy.py [--batches 8,32,128] [--json out.json]

TensorFlow's ``EagerTensor.numpy()`` copies the tensor into a new numpy array. glibc serves an allocation of more
than 32 MB (its largest dynamic mmap threshold) from fresh pages mapped for it and unmaps them when the array is
freed, so each such copy also faults its pages in; smaller ones reuse freed heap memory. The same process run with
``GLIBC_TUNABLES=glibc.malloc.mmap_threshold=...:glibc.malloc.trim_threshold=...`` (both far above the outputs'
size) keeps freed memory and copies into pages already mapped. Each setting runs in a process of its own (glibc
reads the variable at start); outputs are float32 [batch, 128, 768], a BERT-base or GPT-2 sequence output. Without
TensorFlow it times numpy's copy, which is what ``.numpy()`` runs.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

KEEP_FREED = "glibc.malloc.mmap_threshold=1073741824:glibc.malloc.trim_threshold=4294967296"


def _median_ms(fn, rounds: int = 40) -> float:
    fn(), fn()
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - start)
        del out
    return sorted(times)[rounds // 2] * 1e3


def measure(batches) -> dict:
    """In this process: median ms of reading each output with .numpy() (numpy's copy without TensorFlow)."""
    import numpy as np

    try:
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        import tensorflow as tf
    except ImportError:
        tf = None
    rows = {}
    for batch in batches:
        value = np.ones((batch, 128, 768), np.float32)
        if tf is not None:
            tensor = tf.constant(value)
            rows[batch] = _median_ms(tensor.numpy)
        else:
            rows[batch] = _median_ms(value.copy)
    return {"reader": "tf .numpy()" if tf is not None else "numpy copy", "ms": rows}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batches", default="8,32,128")
    ap.add_argument("--json")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    if args.child:
        print(json.dumps(measure(batches)))
        return
    results = {}
    for name, tunables in (("default", None), ("keep freed", KEEP_FREED)):
        env = dict(os.environ)
        env.pop("GLIBC_TUNABLES", None)
        if tunables:
            env["GLIBC_TUNABLES"] = tunables
        out = subprocess.run([sys.executable, __file__, "--child", "--batches", args.batches], env=env,
                             capture_output=True, text=True, check=True).stdout
        results[name] = json.loads(out.strip().splitlines()[-1])
    reader = results["default"]["reader"]
    print(f"{'batch':>5} {'MB':>6} {reader + ' default ms':>24} {'keep freed ms':>14} {'ratio':>6}")
    for batch in batches:
        base, kept = (results[k]["ms"][str(batch)] for k in ("default", "keep freed"))
        print(f"{batch:>5} {batch * 128 * 768 * 4 / 1e6:>6.1f} {base:>24.3f} {kept:>14.3f} {base / kept:>5.2f}x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"tunables": KEEP_FREED, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
