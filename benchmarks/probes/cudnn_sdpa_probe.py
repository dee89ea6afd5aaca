"""Minimal repro for cuDNN's fused attention (cuDNN frontend SDPA graph, fp16) run eagerly and from captured
CUDA graphs, which an earlier session dropped (a replay left the output unchanged; one eager run in four wrong).

Each case builds one SDPA graph over packed [B, S, H*D] q/k/v (strides, no transposes), optionally with an
additive fp16 bias (a padding mask [B,1,1,S] or a mask with a row per query [B,1,S,S]) or cuDNN's causal mask,
and checks it against a float32 numpy reference on fresh random inputs with the output poisoned before every
run, in these set-ups:

  eager            handle bound to the stream that wrote the inputs
  eager/other      handle bound to another stream (no ordering with the writes)
  capture          graph built on handle A, executed with handle B bound to the capturing stream
  capture/build    graph built and executed on the handle bound to the capturing stream
  capture/other    executed with a handle bound to another stream while capturing

then times the graph replayed (20 executions per CUDA graph). GPU machine only; a table last.

H100, cuDNN 9.19 / frontend 1.32 (2026-11-24): every case exact eagerly and replayed, except "capture/other",
whose 6 of 6 replays left the poisoned output as it was (the kernel ran at capture time, outside the graph):
the engine runs cuDNN's attention with the context's handle, bound to the stream it captures on.

    python benchmarks/probes/cudnn_sdpa_probe.py
"""
from __future__ import annotations

import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

MASKED = -30000.0


def build(cudnn, handle, b, h, s, d, bias_shape, causal):
    half, f32 = cudnn.data_type.HALF, cudnn.data_type.FLOAT
    g = cudnn.pygraph(io_data_type=half, intermediate_data_type=f32, compute_data_type=f32, handle=handle)
    strides = [s * h * d, d, h * d, 1]
    Q, K, V = (g.tensor(name=n, dim=[b, h, s, d], stride=strides, data_type=half) for n in "QKV")
    kw = {}
    B = None
    if bias_shape is not None:
        bs = list(bias_shape)
        B = g.tensor(name="bias", dim=bs, stride=[int(np.prod(bs[1:])), int(np.prod(bs[2:])), bs[3], 1],
                     data_type=half)
        kw["bias"] = B
    if causal:
        kw["use_causal_mask"] = True
    try:
        o, _ = g.sdpa(q=Q, k=K, v=V, attn_scale=d ** -0.5, is_inference=True, name="sdpa", **kw)
    except TypeError:
        o, _ = g.sdpa(q=Q, k=K, v=V, attn_scale=d ** -0.5, generate_stats=False, name="sdpa", **kw)
    o.set_output(True).set_data_type(half).set_dim([b, h, s, d]).set_stride(strides)
    g.validate()
    g.build_operation_graph()
    g.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
    g.check_support()
    g.build_plans()
    return g, (Q, K, V, B, o)


def reference(q, k, v, bias, causal, h, d):
    b, s, _ = q.shape
    f = [x.astype(np.float32).reshape(b, s, h, d).transpose(0, 2, 1, 3) for x in (q, k, v)]
    sc = f[0] @ f[1].transpose(0, 1, 3, 2) * d ** -0.5
    if bias is not None:
        sc = sc + bias.astype(np.float32)
    if causal:
        sc = np.where(np.tri(s, dtype=bool), sc, -np.inf)
    sc = np.exp(sc - sc.max(-1, keepdims=True))
    p = sc / sc.sum(-1, keepdims=True)
    return (p @ f[2]).transpose(0, 2, 1, 3).reshape(b, s, h * d)


def main() -> None:
    import cupy as cp

    from tftrt_py.engine.backends.cupy import _device

    cudnn = _device.cudnn_module()
    print("cudnn frontend", getattr(cudnn, "__version__", "?"), "backend", cudnn.backend_version(), flush=True)
    h, d = 12, 64
    cases = {"bert padding": (32, 128, "padding", False), "gpt2 causal": (32, 128, None, True),
             "gpt2 causal+padding rows": (32, 128, "rows", False), "vit 197": (32, 197, None, False),
             "b1 padding": (1, 128, "padding", False)}
    s_a, s_b = cp.cuda.Stream(non_blocking=True), cp.cuda.Stream(non_blocking=True)
    h_a, h_b = cudnn.create_handle(), cudnn.create_handle()
    cudnn.set_stream(h_a, s_a.ptr)
    cudnn.set_stream(h_b, s_b.ptr)
    rows = []
    for name, (b, s, mask, causal) in cases.items():
        rng = np.random.default_rng(0)
        bias_shape = {None: None, "padding": (b, 1, 1, s), "rows": (b, 1, s, s)}[mask]
        graphs = {"A": build(cudnn, h_a, b, h, s, d, bias_shape, causal),
                  "B": build(cudnn, h_b, b, h, s, d, bias_shape, causal)}
        with s_a:
            q, k, v, y = (cp.empty((b, s, h * d), cp.float16) for _ in range(4))
            bias = None if bias_shape is None else cp.empty(bias_shape, cp.float16)
            ws = cp.empty(max(g.get_workspace_size() for g, _ in graphs.values()) + 1, cp.uint8)

        def fill():
            """Fresh inputs and a poisoned output, written on stream A; host copies for the reference."""
            host = [rng.standard_normal((b, s, h * d)).astype(np.float16) for _ in range(3)]
            hb = None
            if bias_shape is not None:
                lengths = rng.integers(s // 2, s + 1, b)
                keep = np.arange(s)[None, :] < lengths[:, None]
                keep = keep[:, None, None, :]
                if mask == "rows":
                    keep = keep & np.tri(s, dtype=bool)
                hb = np.broadcast_to(np.where(keep, 0.0, MASKED), bias_shape).astype(np.float16)
            with s_a:
                for dev, x in zip((q, k, v), host):
                    dev.set(x, stream=s_a)
                if hb is not None:
                    bias.set(np.ascontiguousarray(hb), stream=s_a)
                y.fill(np.nan)
                big = cp.empty(64 << 20, cp.uint8)  # work on stream A that a racing reader would overtake
                big.fill(1)
            return host, hb

        def execute(which, handle):
            g, (Q, K, V, B, O) = graphs[which]
            pack = {Q: q.data.ptr, K: k.data.ptr, V: v.data.ptr, O: y.data.ptr}
            if B is not None:
                pack[B] = bias.data.ptr
            g.execute(pack, ws.data.ptr, handle=handle)

        def error(host, hb):
            s_a.synchronize()
            s_b.synchronize()
            ref = reference(*host, hb, causal, h, d)
            out = cp.asnumpy(y).astype(np.float32)
            if not np.isfinite(out).all():
                return float("inf")
            return float(np.abs(out - ref).max())

        results = {}
        for label, which, handle in (("eager", "A", h_a), ("eager/other", "A", h_b)):
            errs = []
            for _ in range(8):
                host, hb = fill()
                execute(which, handle)
                errs.append(error(host, hb))
            results[label] = errs
        for label, which, handle in (("capture", "B", h_a), ("capture/build", "A", h_a),
                                     ("capture/other", "A", h_b)):
            errs = []
            try:
                s_a.synchronize()
                s_a.begin_capture()
                execute(which, handle)
                graph = s_a.end_capture()
                for _ in range(6):
                    host, hb = fill()
                    graph.launch(s_a)
                    errs.append(error(host, hb))
            except Exception as exc:
                if s_a.is_capturing():
                    s_a.end_capture()
                print(f"{name} {label}: {type(exc).__name__}: {str(exc)[:160]}", flush=True)
                errs = [float("nan")]
            results[label] = errs
        s_a.synchronize()
        s_a.begin_capture()
        for _ in range(20):
            execute("B", h_a)
        graph = s_a.end_capture()
        graph.launch(s_a)
        s_a.synchronize()
        t0 = time.perf_counter()
        start, end = cp.cuda.Event(), cp.cuda.Event()
        start.record(s_a)
        for _ in range(10):
            graph.launch(s_a)
        end.record(s_a)
        end.synchronize()
        us = cp.cuda.get_elapsed_time(start, end) * 1e3 / 200
        wall = (time.perf_counter() - t0) * 1e6 / 200
        print(f"{name}: plan {graphs['A'][0].get_plan_name_at_index(0)}; replay {us:.1f} us "
              f"(wall {wall:.1f}); max errors: " + ", ".join(f"{k} {max(v):.2e}" for k, v in results.items()),
              flush=True)
        rows.append((name, us, results))
    labels = list(rows[0][2])
    print(f"\n{'case':<26} {'replay us':>9} " + " ".join(f"{lab:>14}" for lab in labels))
    for name, us, results in rows:
        print(f"{name:<26} {us:>9.1f} " + " ".join(
            f"{sum(e > 1e-2 for e in results[lab]):>6}/{len(results[lab])} wrong" for lab in labels))


if __name__ == "__main__":
    main()
