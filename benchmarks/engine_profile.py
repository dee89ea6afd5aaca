"""Per-layer GPU times of an engine, for the GPU benchmarks."""
from __future__ import annotations


def profile(engine, ctx, feed: dict, precision: str, runs: int = 3, top: int = 12) -> None:
    """Per-layer GPU times (each step replayed alone from its own CUDA graph, between events): totals by layer
    kind and the top layers."""
    from tftrt_py.engine import Profiler

    ctx.profiler = Profiler()
    for _ in range(runs):
        ctx.execute(feed)
    ctx.profiler, records = None, ctx.profiler.records
    kinds = {l.name: l.kind for l in engine.network.layers}
    precisions = {l.name: l.precision for l in engine.network.layers}
    per_layer = {name: sum(v) / len(v) for name, v in records.items()}
    by_kind = {}
    for name, ms in per_layer.items():
        kind = kinds.get(name, name.split(" (")[-1].rstrip(")"))
        by_kind[kind] = by_kind.get(kind, 0.0) + ms
    total = sum(per_layer.values())
    print(f"profile {precision} (per step, each replayed alone): total {total:.3f} ms; by kind: " +
          ", ".join(f"{k} {v:.3f}" for k, v in sorted(by_kind.items(), key=lambda kv: -kv[1])))
    for name, ms in sorted(per_layer.items(), key=lambda kv: -kv[1])[:top]:
        tactic = {k: v for k, v in engine.tactics.get(name, {}).items() if k in ("op", "plan", "pad_c", "ms")}
        print(f"  {ms:7.3f} ms  {name} [{precisions.get(name)}]  {tactic}")
