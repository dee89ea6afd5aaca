"""Where the model zoo stands: one row per model (tests/zoo/models.py), then why each is not whole.

    python benchmarks/zoo_report.py [--models bert,gpt2,...] [--all] [--json FILE] [--keep DIR]

Each model is exported with random weights, converted in FP32 and FP16, built for its shapes, saved, reloaded in a
fresh process and served fresh inputs at the built batch, then at batch 1 (tests/zoo/measure.py says what is
counted, tests/zoo/report.py formats the table). Columns: share of compute ops serving in engines, engine ops
(FP32/FP16), native fallbacks while serving the built batch (FP32/FP16), FP32 max abs error (target 1e-4), FP16
max abs error over the output's max magnitude (target 1e-2); at batch 1 (B1), the same errors against native TF
at batch 1, native fallbacks (FP32/FP16) and how the engine ops served it (FP32/FP16): Nrw by their row-wise engine
(padded, or a copy for the smaller batch), Nnew by an engine built at run time. Default: the models the zoo tests
hold to the targets; --all adds the optional ones (DistilBERT, RoBERTa, Gemma, T5, Whisper).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [REPO, os.path.join(REPO, "tests")]

from zoo.measure import measure  # noqa: E402
from zoo.models import REQUIRED, ZOO  # noqa: E402
from zoo.report import format_table  # noqa: E402


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", help="comma-separated names (default: the tested models)")
    parser.add_argument("--all", action="store_true", help="every zoo model, the optional ones too")
    parser.add_argument("--json", help="also write the results as JSON to this file")
    parser.add_argument("--keep", help="work in this directory (SavedModels kept) instead of a temporary one")
    args = parser.parse_args(argv)
    names = args.models.split(",") if args.models else list(ZOO if args.all else REQUIRED)
    unknown = [n for n in names if n not in ZOO]
    if unknown:
        parser.error(f"unknown model(s) {unknown}; known: {', '.join(ZOO)}")
    root = args.keep or tempfile.mkdtemp(prefix="tftrt_zoo_")
    results = []
    for name in names:
        workdir = os.path.join(root, name)
        os.makedirs(workdir, exist_ok=True)
        results.append(measure(name, workdir))
        print(f"[{name}: {results[-1].seconds:.0f}s]", file=sys.stderr, flush=True)
    print(format_table(results))
    if args.json:
        with open(args.json, "w") as f:
            json.dump([dataclasses.asdict(r) for r in results], f, indent=1)


if __name__ == "__main__":
    main()
