"""Engines of several precisions timed fairly against each other: each one's back-to-back GPU time a call, the
engines taking turns for several rounds, so that the GPU's clock and temperature drift over a run reach them
alike (one engine timed after the other moved the BERT layer's INT8 / FP16 ratio by up to 8% between runs).
Ratios are the median of the per-round ratios. Needs cupy and a GPU.
"""
from __future__ import annotations

import statistics
import time
from typing import Callable, Dict, Hashable, List


def gpu_us_per_call(call: Callable[[], object], calls: int = 50, warm_s: float = 0.2) -> dict:
    """{"gpu": GPU microseconds a call over `calls` back-to-back calls on the current stream (CUDA events),
    "host": the host's microseconds a call in that loop}: where host reaches gpu, the loop was bound by the host
    and gpu says so little of the engine. Calls run `warm_s` seconds first (clocks rise, caches fill)."""
    import cupy

    stream = cupy.cuda.get_current_stream()
    start = time.perf_counter()
    while time.perf_counter() - start < warm_s:
        call()
    stream.synchronize()
    begin, end = cupy.cuda.Event(), cupy.cuda.Event()
    begin.record(stream)
    t0 = time.perf_counter()
    for _ in range(calls):
        call()
    host = (time.perf_counter() - t0) / calls * 1e6
    end.record(stream)
    end.synchronize()
    return {"gpu": cupy.cuda.get_elapsed_time(begin, end) * 1e3 / calls, "host": host}


def rounds(calls: Dict[Hashable, Callable[[], object]], n: int, base: Hashable) -> Dict[Hashable, dict]:
    """Each of `calls` timed by gpu_us_per_call once a round for `n` rounds, in turn: key -> {"gpu_us": median,
    "host_us": median, "rounds": the GPU times, "vs_base": median over rounds of base's time / this one's}."""
    times: Dict[Hashable, List[dict]] = {key: [] for key in calls}
    for _ in range(n):
        for key, call in calls.items():
            times[key].append(gpu_us_per_call(call))
    out = {}
    for key, ts in times.items():
        gpu = [t["gpu"] for t in ts]
        out[key] = {"gpu_us": statistics.median(gpu), "host_us": statistics.median(t["host"] for t in ts),
                    "rounds": gpu}
        if base in times:
            out[key]["vs_base"] = statistics.median(b["gpu"] / t for b, t in zip(times[base], gpu))
    return out


def report(label: str, results: Dict[Hashable, dict], base: Hashable) -> str:
    """One line per key: median GPU us a call, its spread over rounds, host us, ratio to `base`."""
    lines = [f"{label}: back-to-back GPU us a call, median of {len(next(iter(results.values()))['rounds'])} "
             f"interleaved rounds (min-max), host us a call, speed-up over {base} (median of per-round ratios)"]
    for key, r in results.items():
        ratio = f"{r['vs_base']:.3f}x" if "vs_base" in r else "-"
        lines.append(f"  {str(key):<8} {r['gpu_us']:9.1f} ({min(r['rounds']):.1f}-{max(r['rounds']):.1f})  host "
                     f"{r['host_us']:7.1f}  {ratio}")
    return "\n".join(lines)
