"""The zoo's results as text: one table row per model (tests/zoo/measure.py measures them), then why each model is
not whole."""
from __future__ import annotations

import collections
import io
from typing import List, Optional

from zoo.measure import ModelResult, PrecisionResult

__all__ = ["format_table", "details"]


def _cell(result: Optional[PrecisionResult], what: str) -> str:
    if result is None:
        return "-"
    if result.convert_error:
        return "convert error"
    if result.serve_error:
        return "serve error"
    if what == "in":
        return f"{100 * result.in_engines:.1f}% [{result.ops_in_engines}/{result.ops_held}]"
    if what == "err1":
        if result.batch1 is not None and result.batch1.serve_error:
            return "serve error"
        return "-" if result.error_batch1 is None else f"{result.error_batch1:.1e}"
    return "-" if result.error is None else f"{result.error:.1e}"


def _served1(result: PrecisionResult) -> str:
    """How the engine ops served batch 1: N row-wise (their built engine), N new (built at run time)."""
    one = result.batch1
    if one is None or one.serve_error:
        return "-"
    return "+".join(part for part in (f"{one.rowwise}rw" if one.rowwise else "", f"{one.builds}new" if one.builds
                                      else "") if part) or "0"


def format_table(models: List[ModelResult]) -> str:
    """One row per model (FP32 / FP16 side by side), then each model's reasons for not being whole."""
    out = io.StringIO()
    header = ("model", "FP32 ops in engines", "FP16 ops in eng.", "engines", "fallbacks", "FP32 err",
              "FP16 rel err", "B1 FP32 err", "B1 FP16 err", "B1 fallbacks", "B1 served", "time", "status")
    widths = (18, 22, 22, 8, 9, 9, 12, 11, 11, 12, 18, 6, 6)
    line = lambda cells: "  ".join(str(c).ljust(w) for c, w in zip(cells, widths)).rstrip()  # noqa: E731
    print(line(header), file=out)
    for m in models:
        fp32, fp16 = m.results.get("FP32"), m.results.get("FP16")
        if m.export_error:
            print(line((m.name, "export error") + ("",) * 9 + (f"{m.seconds:.0f}s", "FAIL")), file=out)
            continue
        both = [r for r in (fp32, fp16) if r is not None]
        engines = "/".join(str(r.engines) for r in both)
        fallbacks = "/".join(str(r.fallbacks) for r in both)
        fallbacks1 = "/".join("-" if r.batch1 is None else str(r.batch1.fallbacks) for r in both)
        status = "ok" if not any(r.failures() for r in both) else "FAIL"
        print(line((m.name, _cell(fp32, "in"), _cell(fp16, "in"), engines, fallbacks, _cell(fp32, "err"),
                    _cell(fp16, "err"), _cell(fp32, "err1"), _cell(fp16, "err1"), fallbacks1,
                    "/".join(_served1(r) for r in both), f"{m.seconds:.0f}s", status)), file=out)
    print(file=out)
    for m in models:
        lines = details(m)
        if lines:
            print(f"{m.name}:", file=out)
            for ln in lines:
                print(f"  - {ln}", file=out)
    return out.getvalue()


def details(m: ModelResult, max_lines=8) -> List[str]:
    """Why `m` is not whole: export/convert/serve errors, target misses (at the built batch and at batch 1), native
    segment runs at batch 1 of engine ops not expected to serve it, op types left native (with reasons), native runs
    after build, at serving and at batch 1 (build failure messages); Keras's own FP16 error and TF's own FP32 spread
    where measured."""
    if m.export_error:
        return [f"export: {m.export_error}"]
    lines = []
    for r in m.results.values():
        lines += r.failures()
        ours = f"(ours {r.error if r.error is None else format(r.error, '.2g')}, target {r.target:g})"
        if r.keras_fp16_rel_error is not None:
            lines.append(f"{r.precision}: Keras mixed_float16's own error on these inputs {r.keras_fp16_rel_error:.2g} "
                         + ours)
        if r.tf_kernels_error is not None:
            lines.append(f"{r.precision}: TF's oneDNN and Eigen kernels differ on these inputs by "
                         f"{r.tf_kernels_error:.2g} " + ours)
        one = r.batch1
        if one is not None and one.fallbacks > one.expected_fallbacks:
            lines.append(f"{r.precision} batch 1: {one.fallbacks - one.expected_fallbacks} native fallback(s) of "
                         f"engine ops neither row-wise nor allowed to build at run time (correct, slower)")
    lines += [f"native: {ln}" for ln in m.top_native()]
    runs = []
    for r in m.results.values():
        runs += [f"{r.precision} {ln}" for ln in r.native_runs + (r.batch1.native_runs if r.batch1 else [])]
    lines += [ln[:300] for ln in list(collections.OrderedDict.fromkeys(runs))[:max_lines]]
    return lines
