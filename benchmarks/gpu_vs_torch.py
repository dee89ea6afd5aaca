"""ResNet-50 v1.5 (random weights, batch norm folded) in our cupy engine vs PyTorch on the same GPU.

Our FP32 (TF32 off) and FP16 engines against PyTorch eager (cudnn.benchmark, channels_last, fp16)
and torch.compile; the same weights are copied into an equivalent torch model (convolutions with
bias, as our network has after folding). Timing: CUDA events, warm-up first, medians; inputs stay
on the GPU for every framework. Prints the GPU, the ceilings (fp16 GEMM rate, copy bandwidth), the
roofline of ResNet-50, and a table last.

    python benchmarks/gpu_vs_torch.py --batches 1 8 32 128 --compile-mode reduce-overhead
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests", "engine", "gpu"))

import gpu_resnet50 as resnet50  # noqa: E402


def torch_model(model, torch):
    nn, F = torch.nn, torch.nn.functional

    def conv(c):
        k = c["kernel"]
        m = nn.Conv2d(k.shape[2], k.shape[3], k.shape[0], c["stride"], c["pad"], bias=True)
        m.weight.data = torch.from_numpy(np.ascontiguousarray(k.transpose(3, 2, 0, 1)))
        m.bias.data = torch.from_numpy(c["bias"])
        return m

    class ResNet50(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = conv(model["stem"])
            self.blocks = nn.ModuleList(nn.ModuleList([conv(c1), conv(c2), conv(c3)] + ([conv(p)] if p else []))
                                        for c1, c2, c3, p in model["blocks"])
            w, b = model["fc"]
            self.fc = nn.Linear(w.shape[0], w.shape[1])
            self.fc.weight.data = torch.from_numpy(np.ascontiguousarray(w.T))
            self.fc.bias.data = torch.from_numpy(b)

        def forward(self, x):
            y = F.max_pool2d(F.relu(self.stem(x)), 3, 2, 1)
            for block in self.blocks:
                shortcut = block[3](y) if len(block) == 4 else y
                y = F.relu(block[2](F.relu(block[1](F.relu(block[0](y))))) + shortcut)
            return self.fc(y.mean((2, 3)))

    return ResNet50()


def time_loop(fn, stream_sync, iters: int, warmup: int, event_cls):
    """(median latency ms of single calls, throughput calls/s of a back-to-back loop)."""
    for _ in range(warmup):
        fn()
    stream_sync()
    lat = []
    for _ in range(iters):
        start, end = event_cls(), event_cls()
        start.record()
        fn()
        end.record()
        end.synchronize()
        lat.append(start.elapsed_time(end) if hasattr(start, "elapsed_time") else end.elapsed(start))
    start, end = event_cls(), event_cls()
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    end.synchronize()
    total = start.elapsed_time(end)
    return statistics.median(lat), iters / (total / 1e3)


class CupyEvent:
    def __init__(self):
        import cupy

        self.ev = cupy.cuda.Event()

    def record(self):
        import cupy

        self.ev.record(cupy.cuda.get_current_stream())

    def synchronize(self):
        self.ev.synchronize()

    def elapsed_time(self, end):
        import cupy

        return cupy.cuda.get_elapsed_time(self.ev, end.ev)


def profile(engine, ctx, x, precision, runs: int = 3) -> None:
    """Per-layer GPU times (eager, events around each step): totals by layer kind and the top layers."""
    from tftrt_py.engine import Profiler

    ctx.profiler = Profiler()
    for _ in range(runs):
        ctx.execute({"input": x})
    ctx.profiler, records = None, ctx.profiler.records
    kinds = {l.name: l.kind for l in engine.network.layers}
    per_layer = {name: sum(v) / len(v) for name, v in records.items()}
    by_kind = {}
    for name, ms in per_layer.items():
        kind = kinds.get(name, name.split(" (")[-1].rstrip(")"))
        by_kind[kind] = by_kind.get(kind, 0.0) + ms
    total = sum(per_layer.values())
    print(f"profile {precision} (eager, per step): total {total:.3f} ms; by kind: " +
          ", ".join(f"{k} {v:.3f}" for k, v in sorted(by_kind.items(), key=lambda kv: -kv[1])))
    for name, ms in sorted(per_layer.items(), key=lambda kv: -kv[1])[:12]:
        tactic = {k: v for k, v in engine.tactics.get(name, {}).items() if k in ("op", "plan", "pad_c", "ms")}
        print(f"  {ms:7.3f} ms  {name}  {tactic}")


def ceilings(torch):
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.float16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.float16)
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(10):
        a @ b
    e.record()
    e.synchronize()
    tflops = 2 * 8192 ** 3 * 10 / (s.elapsed_time(e) / 1e3) / 1e12
    x = torch.randn(1 << 28, device="cuda", dtype=torch.float32)  # 1 GiB
    y = torch.empty_like(x)
    y.copy_(x)
    s.record()
    for _ in range(10):
        y.copy_(x)
    e.record()
    e.synchronize()
    tbs = 2 * x.numel() * 4 * 10 / (s.elapsed_time(e) / 1e3) / 1e12
    del a, b, x, y
    torch.cuda.empty_cache()
    return tflops, tbs


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32, 128])
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--precisions", nargs="*", default=["FP32", "FP16"])
    p.add_argument("--torch", nargs="*", default=["eager", "compile"], help="torch variants: eager compile")
    p.add_argument("--compile-mode", default="reduce-overhead")
    p.add_argument("--compile-batches", type=int, nargs="*", default=None, help="torch.compile only these batches")
    p.add_argument("--profile", action="store_true", help="per-layer times of our engines at the largest batch")
    p.add_argument("--iters", type=int, default=30)
    p.add_argument("--json", default=None, help="write all numbers here")
    args = p.parse_args(argv)

    import cupy
    import torch

    from tftrt_py.engine import Builder, BuilderConfig
    from tftrt_py.engine.backends import get_backend

    torch.backends.cudnn.benchmark = True
    gpu = torch.cuda.get_device_name()
    tflops, tbs = ceilings(torch)
    print(f"GPU: {gpu}; torch {torch.__version__}, cupy {cupy.__version__}")
    print(f"ceilings: fp16 GEMM {tflops:.0f} TFLOP/s, device copy {tbs:.2f} TB/s")
    model = resnet50.spec()
    flop = resnet50.flops(1, args.size, model)
    print(f"ResNet-50 at {args.size}: {flop / 1e9:.2f} GFLOP/image; fp16 compute floor {flop / (tflops * 1e12) * 1e6:.1f} "
          f"us/image ({tflops * 1e12 / flop:,.0f} img/s)")
    rows, results = [], {"gpu": gpu, "gemm_tflops": tflops, "copy_tbs": tbs, "gflop_per_image": flop / 1e9}
    tmodel = torch_model(model, torch).cuda().eval()

    for batch in args.batches:
        rng = np.random.default_rng(batch)
        x_np = rng.standard_normal((batch, args.size, args.size, 3)).astype(np.float32)
        x_cp = cupy.asarray(x_np)
        ref = None
        with torch.no_grad():
            xt32 = torch.from_numpy(x_np).cuda().permute(0, 3, 1, 2).contiguous(memory_format=torch.channels_last)
            torch.backends.cudnn.allow_tf32 = False
            torch.backends.cuda.matmul.allow_tf32 = False
            ref = tmodel.to(memory_format=torch.channels_last)(xt32).float().cpu().numpy()
        for precision in args.precisions:
            t0 = time.perf_counter()
            engine = Builder(BuilderConfig(precision=precision, backend="cupy")).build_engine(
                resnet50.network(batch, args.size, model))
            build_s = time.perf_counter() - t0
            ctx = engine.create_execution_context()
            out = ctx.execute({"input": x_cp})["logits"]
            cupy.cuda.get_current_stream().synchronize()
            err = float(np.linalg.norm(cupy.asnumpy(out) - ref) / np.linalg.norm(ref))
            lat, tput = time_loop(lambda: ctx.execute({"input": x_cp}), cupy.cuda.Device().synchronize, args.iters,
                                  5, CupyEvent)
            mem = get_backend("cupy").memory_report(engine)
            if args.profile and batch == max(args.batches):
                profile(engine, ctx, x_cp, precision)
            rows.append((batch, f"ours {precision}", lat, tput * batch, build_s, err))
            results[f"ours_{precision}_{batch}"] = {"latency_ms": lat, "img_s": tput * batch, "build_s": build_s,
                                                    "rel_err_vs_torch_fp32": err, "memory": mem,
                                                    "tactics": engine.tactics}
            print(f"batch {batch} ours {precision}: {lat:.3f} ms, {tput * batch:,.0f} img/s, build {build_s:.1f} s, "
                  f"rel err vs torch fp32 {err:.1e}, memory {json.dumps({k: round(v / 2**20) for k, v in mem.items()})} MiB",
                  flush=True)
            ctx = engine = None
        with torch.no_grad():
            th = tmodel.half().to(memory_format=torch.channels_last)
            xt = torch.from_numpy(x_np).cuda().half().permute(0, 3, 1, 2).contiguous(memory_format=torch.channels_last)
            variants = []
            if "eager" in args.torch:
                variants.append(("torch eager FP16", th))
            if "compile" in args.torch and (args.compile_batches is None or batch in args.compile_batches):
                variants.append((f"torch.compile {args.compile_mode} FP16",
                                 torch.compile(th, mode=args.compile_mode, dynamic=False)))
            for name, fn in variants:
                t0 = time.perf_counter()
                fn(xt)
                torch.cuda.synchronize()
                first_s = time.perf_counter() - t0
                lat, tput = time_loop(lambda: fn(xt), torch.cuda.synchronize, args.iters, 5,
                                      lambda: torch.cuda.Event(enable_timing=True))
                rows.append((batch, name, lat, tput * batch, first_s, float("nan")))
                results[f"{name}_{batch}"] = {"latency_ms": lat, "img_s": tput * batch, "first_call_s": first_s}
                print(f"batch {batch} {name}: {lat:.3f} ms, {tput * batch:,.0f} img/s (first call {first_s:.1f} s)",
                      flush=True)
            tmodel.float()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1, default=str)
    floor = flop / (tflops * 1e12)
    print(f"\n{'batch':>5} {'variant':<36} {'latency ms':>10} {'img/s':>9} {'% fp16 roofline':>15} {'build/1st s':>11}")
    for batch, name, lat, ips, build_s, err in rows:
        print(f"{batch:>5} {name:<36} {lat:>10.3f} {ips:>9,.0f} {100 * ips * floor:>14.1f}% {build_s:>11.1f}")


if __name__ == "__main__":
    main()
