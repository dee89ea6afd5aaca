"""ResNet-50 v1.5 and a BERT-base encoder layer (random weights) in our cupy engine vs PyTorch on the
same GPU.

ResNet-50 (batch norm folded): our FP32 (TF32 off), FP16 and INT8 engines (INT8 calibrated by max |value|
of each tensor over two random batches run through our FP32 engine) against PyTorch eager
(cudnn.benchmark, channels_last, fp16) and torch.compile; the same weights are copied into an
equivalent torch model (convolutions with bias, as our network has after folding). BERT layer (seq 128,
hidden 768, 12 heads, FFN 3072, GELU, LayerNorm; fp16 bindings): our FP16 and INT8 engines against the
same block in PyTorch (SDPA attention) eager fp16 and torch.compile; ``--bert-layers N``: a stack of N such
layers (one set of weights), where each layer after the first reads its input from the previous LayerNorm (an
INT8 or FP8 engine's LayerNorm then writes it quantized too). ``--autotune-limit`` retries
torch.compile(mode="max-autotune") for ResNet-50 in a subprocess with that time limit.

Timing: CUDA events, warm-up first, medians; inputs stay on the GPU for every framework. Our engines of one
model and batch are then timed again in ``--rounds`` interleaved rounds (benchmarks/interleaved.py): their
speed-ups over FP16 are the median of the per-round ratios. Prints the GPU, the ceilings (fp16 GEMM rate, copy
bandwidth), each model's compute floor, and tables last.

    python benchmarks/gpu_vs_torch.py --batches 1 8 32 128 --bert-batches 1 32 --autotune-limit 180
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import time
import traceback

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests", "engine", "gpu"))

import gpu_bert as bert  # noqa: E402
from engine_profile import profile  # noqa: E402
import interleaved  # noqa: E402
import gpu_resnet50 as resnet50  # noqa: E402
from gpu_calibrate import apply_ranges, max_abs_ranges  # noqa: E402


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


def time_loop(fn, stream_sync, iters: int, warmup: int, event_cls, warm_s: float = 0.5):
    """(median latency ms of single calls, throughput calls/s of a back-to-back loop); also prints the host's
    microseconds per call in that loop (the loop is bound by the host where they reach the GPU's time per call).
    Calls run for `warm_s` seconds (and `warmup` calls at least) first: an idle GPU's clocks take that long to rise,
    and whatever ran first would be timed slower."""
    start = time.perf_counter()
    for i in itertools.count():
        fn()
        if i + 1 >= warmup and time.perf_counter() - start >= warm_s:
            break
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
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    host_us = (time.perf_counter() - t0) / iters * 1e6
    end.record()
    end.synchronize()
    total = start.elapsed_time(end)
    print(f"  back-to-back: host {host_us:.1f} us per call, GPU {total / iters * 1e3:.1f} us per call", flush=True)
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


class Table:
    """Rows (model, batch, variant, latency ms, items/s, build or first-call s, relative error) and the JSON
    results; the JSON file is rewritten after every row, so a killed run keeps what it measured."""

    def __init__(self, path, results):
        self.path, self.results, self.rows = path, results, []

    def add(self, model, batch, variant, lat, per_s, build_s, err=float("nan"), **extra):
        self.rows.append((model, batch, variant, lat, per_s, build_s, err))
        self.results[f"{model} {variant} {batch}"] = dict(latency_ms=lat, per_s=per_s, build_s=build_s, rel_err=err,
                                                          **extra)
        self.save()

    def save(self):
        if self.path:
            with open(self.path, "w") as f:
                json.dump(self.results, f, indent=1, default=str)

    def print(self, floors):
        for model in dict.fromkeys(r[0] for r in self.rows):
            unit = "img/s" if model == "resnet50" else "seq/s"
            print(f"\n{model}: {'batch':>5} {'variant':<48} {'latency ms':>10} {unit:>9} {'% roofline':>10} "
                  f"{'build/1st s':>11} {'rel err':>8}")
            for m, batch, name, lat, per_s, build_s, err in self.rows:
                if m == model:
                    print(f"{'':>{len(model) + 1}} {batch:>5} {name:<48} {lat:>10.3f} {per_s:>9,.0f} "
                          f"{100 * per_s * floors[model]:>9.1f}% {build_s:>11.1f} {err:>8.1e}")


def ours(table, model, batch, precision, build, x, ref, iters, profile_it=False):
    """Build our engine with `build()`, check it against `ref`, time it; a failure is printed, not raised.
    Returns the timed call (None on failure)."""
    import cupy

    from tftrt_py.engine.backends import get_backend

    try:
        t0 = time.perf_counter()
        engine = build()
        build_s = time.perf_counter() - t0
        ctx = engine.create_execution_context()
        name = engine.inputs[0].name
        out = list(ctx.execute({name: x}).values())[0]
        cupy.cuda.get_current_stream().synchronize()
        err = float(np.linalg.norm(cupy.asnumpy(out).astype(np.float64) - ref) / np.linalg.norm(ref))
        lat, tput = time_loop(lambda: ctx.execute({name: x}), cupy.cuda.Device().synchronize, iters, 5, CupyEvent)
        mem = get_backend("cupy").memory_report(engine)
        if profile_it:
            profile(engine, ctx, {engine.inputs[0].name: x}, precision)
        ops = {}
        for t in engine.tactics.values():
            ops[t.get("op")] = ops.get(t.get("op"), 0) + 1
        table.add(model, batch, f"ours {precision}", lat, tput * batch, build_s, err, memory=mem, ops=ops)
        print(f"{model} batch {batch} ours {precision}: {lat:.3f} ms, {tput * batch:,.0f}/s, build {build_s:.1f} s, "
              f"rel err vs torch fp32 {err:.1e}, ops {ops}, memory "
              f"{json.dumps({k: round(v / 2**20) for k, v in mem.items()})} MiB", flush=True)
        return lambda: ctx.execute({name: x})
    except Exception as exc:
        print(f"{model} batch {batch} ours {precision} FAILED: {type(exc).__name__}: {exc}", flush=True)
        traceback.print_exc()
        return None


def interleaved_rounds(table, args, model, batch, calls) -> None:
    """Our engines of one model and batch (precision -> call) timed again in `args.rounds` interleaved rounds."""
    calls = {p: c for p, c in calls.items() if c is not None}
    if args.rounds < 1 or len(calls) < 2:
        return
    found = interleaved.rounds(calls, args.rounds, "FP16")
    table.results[f"{model} interleaved {batch}"] = found
    table.save()
    print(interleaved.report(f"{model} batch {batch}", found, "FP16"), flush=True)


def torch_variants(table, model, batch, fn_eager, x, args, torch, modes, eager=True, label=""):
    """PyTorch eager (if `eager`) and torch.compile (each of `modes`) on `x`, `label` after their names; failures
    are printed."""
    variants = [(f"torch eager FP16{label}", lambda: fn_eager)] if eager and "eager" in args.torch else []
    for mode in modes:
        variants.append((f"torch.compile {mode} FP16{label}", lambda mode=mode: torch.compile(fn_eager, mode=mode,
                                                                                               dynamic=False)))
    for name, make in variants:
        try:
            fn = make()
            t0 = time.perf_counter()
            with torch.no_grad():
                fn(x)
            torch.cuda.synchronize()
            first_s = time.perf_counter() - t0

            def call():
                with torch.no_grad():
                    return fn(x)

            lat, tput = time_loop(call, torch.cuda.synchronize, args.iters, 5,
                                  lambda: torch.cuda.Event(enable_timing=True))
            table.add(model, batch, name, lat, tput * batch, first_s)
            print(f"{model} batch {batch} {name}: {lat:.3f} ms, {tput * batch:,.0f}/s (first call {first_s:.1f} s)",
                  flush=True)
        except Exception as exc:
            print(f"{model} batch {batch} {name} FAILED: {type(exc).__name__}: {exc}", flush=True)


def resnet_source(args, cupy):
    """(spec the torch model copies, network(batch) for our engines, INT8 ranges or None, description).

    With ``--plan``: the network and weights of a plan exported here from the converted Keras model
    (benchmarks/make_resnet50_plan.py; its tensors carry the converter's calibration ranges), re-batched
    for each batch. Otherwise the Network-API ResNet-50 of the GPU tests, calibrated on the GPU.
    """
    if args.plan:
        from tftrt_py.engine.plan import deserialize
        from tftrt_py.engine.runtime import rebatched

        with open(args.plan, "rb") as f:
            base = deserialize(f.read(), backend="numpy").network
        args.size = base.inputs[0].shape[1]
        return (resnet50.spec_from_network(base), lambda batch: rebatched(base, batch), None,
                f"plan {os.path.basename(args.plan)} ({len(base.layers)} layers, INT8 ranges from its calibration)")
    model = resnet50.spec()
    ranges = None
    if {"INT8", "FP8"} & set(args.precisions) and not args.torch_only:
        rng = np.random.default_rng(0)
        calib = [{"input": cupy.asarray(rng.standard_normal((8, args.size, args.size, 3)).astype(np.float32))}
                 for _ in range(2)]
        ranges = max_abs_ranges(lambda: resnet50.network(8, args.size, model), calib, backend="cupy")
    return (model, lambda batch: resnet50.network(batch, args.size, model), ranges,
            "Network-API ResNet-50 (INT8 ranges: max |value| over 2 random batches of 8 through our FP32 engine)")


def bench_resnet(args, table, torch, cupy):
    from tftrt_py.engine import Builder, BuilderConfig

    model, network, ranges, what = resnet_source(args, cupy)
    print(f"ResNet-50 source: {what}", flush=True)
    table.results["resnet50_source"] = what
    tmodel = torch_model(model, torch).cuda().eval()
    for batch in args.batches:
        rng = np.random.default_rng(batch)
        x_np = rng.standard_normal((batch, args.size, args.size, 3)).astype(np.float32)
        x_cp = cupy.asarray(x_np)
        with torch.no_grad():
            xt32 = torch.from_numpy(x_np).cuda().permute(0, 3, 1, 2).contiguous(memory_format=torch.channels_last)
            torch.backends.cudnn.allow_tf32 = False
            torch.backends.cuda.matmul.allow_tf32 = False
            ref = tmodel.float().to(memory_format=torch.channels_last)(xt32).double().cpu().numpy()
        calls = {}
        for precision in ([] if args.torch_only else args.precisions):
            def build(precision=precision):
                net = network(batch)
                if precision in ("INT8", "FP8") and ranges is not None:
                    apply_ranges(net, ranges)
                return Builder(BuilderConfig(precision=precision, backend="cupy")).build_engine(net)

            calls[precision] = ours(table, "resnet50", batch, precision, build, x_cp, ref, args.iters,
                                    args.profile and batch == max(args.batches))
        interleaved_rounds(table, args, "resnet50", batch, calls)
        del calls
        th = tmodel.half().to(memory_format=torch.channels_last)
        xt = torch.from_numpy(x_np).cuda().half().permute(0, 3, 1, 2).contiguous(memory_format=torch.channels_last)
        modes = [args.compile_mode] if ("compile" in args.torch and (args.compile_batches is None
                                                                     or batch in args.compile_batches)) else []
        torch_variants(table, "resnet50", batch, th, xt, args, torch, modes)
        tmodel.float()
        torch.compiler.reset()


def bert_label(args) -> str:
    return "bert_layer" if args.bert_layers == 1 else f"bert_{args.bert_layers}_layers"


def bench_bert(args, table, torch, cupy):
    from tftrt_py.engine import Builder, BuilderConfig

    model, layers, label = bert.spec(), args.bert_layers, bert_label(args)
    tblock = bert.torch_block(model, torch, layers=layers).cuda().eval()
    ranges = None
    if {"INT8", "FP8"} & set(args.bert_precisions):
        rng = np.random.default_rng(1)
        calib = [{"x": cupy.asarray(rng.standard_normal((8, args.seq, model["hidden"])).astype(np.float32))}
                 for _ in range(2)]
        ranges = max_abs_ranges(lambda: bert.network(8, args.seq, model, dtype="float32", layers=layers), calib,
                                backend="cupy")
    for batch in args.bert_batches:
        rng = np.random.default_rng(batch)
        x_np = rng.standard_normal((batch, args.seq, model["hidden"])).astype(np.float32)
        with torch.no_grad():
            torch.backends.cuda.matmul.allow_tf32 = False
            ref = tblock.float()(torch.from_numpy(x_np).cuda()).double().cpu().numpy()
        x16 = cupy.asarray(x_np.astype(np.float16))
        calls = {}
        for precision in args.bert_precisions:
            def build(precision=precision):
                net = bert.network(batch, args.seq, model, layers=layers)
                if precision in ("INT8", "FP8"):
                    apply_ranges(net, ranges)
                return Builder(BuilderConfig(precision=precision, backend="cupy")).build_engine(net)

            calls[precision] = ours(table, label, batch, precision, build, x16, ref, args.iters,
                                    args.profile and batch == max(args.bert_batches))
        interleaved_rounds(table, args, label, batch, calls)
        del calls
        th = tblock.half()
        modes = [args.compile_mode] if "compile" in args.torch else []
        torch_variants(table, label, batch, th, torch.from_numpy(x_np).cuda().half(), args, torch, modes)
        tblock.float()
        torch.compiler.reset()
        # Our fp16 GEMM fuses the erf GELU as the tanh form (cublaslt.REDUCED_GELU): torch.compile on that form too.
        tanh_block = bert.torch_block(model, torch, gelu="tanh", layers=layers).cuda().eval().half()
        torch_variants(table, label, batch, tanh_block, torch.from_numpy(x_np).cuda().half(), args, torch,
                       modes, eager=False, label=", tanh GELU")
        del tanh_block
        torch.compiler.reset()


def max_autotune(args, table):
    """torch.compile(mode="max-autotune") for ResNet-50 at ``--autotune-batches`` (default: 1 and the largest),
    in a subprocess given `args.autotune_limit` seconds; rows it finished are kept."""
    path = os.path.join(os.environ.get("OUT", "/tmp"), "max_autotune.json")
    if os.path.exists(path):
        os.remove(path)
    batches = sorted(set(args.autotune_batches or (1, max(args.batches))))
    cmd = [sys.executable, os.path.abspath(__file__), "--torch-only", "--models", "resnet50", "--torch", "compile",
           *(["--plan", args.plan] if args.plan else []),
           "--compile-mode", "max-autotune", "--batches", *map(str, batches), "--iters", str(args.iters),
           "--json", path]
    t0 = time.perf_counter()
    try:
        subprocess.run(cmd, timeout=args.autotune_limit, check=False)
        status = f"finished in {time.perf_counter() - t0:.0f} s"
    except subprocess.TimeoutExpired:
        status = f"did not finish within {args.autotune_limit:.0f} s"
    done = json.load(open(path)) if os.path.exists(path) else {}
    for key, r in done.items():
        if key.startswith("resnet50 torch.compile"):
            model, rest = key.split(" ", 1)
            variant, batch = rest.rsplit(" ", 1)
            table.add(model, int(batch), variant, r["latency_ms"], r["per_s"], r["build_s"])
    missing = [b for b in batches if f"resnet50 torch.compile max-autotune FP16 {b}" not in done]
    print(f"torch.compile max-autotune (ResNet-50, batches {batches}): {status}" +
          (f"; no result for batch(es) {missing}" if missing else ""), flush=True)
    table.results["max_autotune"] = {"status": status, "missing_batches": missing}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="+", default=["resnet50", "bert"])
    p.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32, 128])
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--plan", default=None, help="ResNet-50 from this plan (benchmarks/make_resnet50_plan.py)")
    p.add_argument("--precisions", nargs="*", default=["FP32", "FP16", "INT8"])
    p.add_argument("--bert-batches", type=int, nargs="+", default=[1, 32])
    p.add_argument("--bert-precisions", nargs="*", default=["FP16", "INT8"])
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--bert-layers", type=int, default=1,
                   help="a stack of this many BERT layers (each a copy of the one layer's weights)")
    p.add_argument("--torch", nargs="*", default=["eager", "compile"], help="torch variants: eager compile")
    p.add_argument("--torch-only", action="store_true", help="only the torch rows (no engines, no ceilings)")
    p.add_argument("--compile-mode", default="reduce-overhead")
    p.add_argument("--compile-batches", type=int, nargs="*", default=None, help="torch.compile only these batches")
    p.add_argument("--autotune-limit", type=float, default=0,
                   help="seconds for a max-autotune retry of ResNet-50 at batch 1 and the largest (0: skip)")
    p.add_argument("--autotune-batches", type=int, nargs="*", default=None,
                   help="batches of the max-autotune retry (default: 1 and the largest)")
    p.add_argument("--profile", action="store_true",
                   help="per-layer times of our engines at the largest batch (ResNet-50 and BERT)")
    p.add_argument("--iters", type=int, default=30)
    p.add_argument("--rounds", type=int, default=7, help="interleaved rounds timing our engines of one model and "
                   "batch against each other (0: none)")
    p.add_argument("--json", default=None, help="write all numbers here")
    args = p.parse_args(argv)

    import cupy
    import torch

    torch.backends.cudnn.benchmark = True
    gpu = torch.cuda.get_device_name()
    results = {"gpu": gpu}
    floors = {"resnet50": 0.0, bert_label(args): 0.0}
    if not args.torch_only:
        tflops, tbs = ceilings(torch)
        results.update(gemm_tflops=tflops, copy_tbs=tbs)
        print(f"GPU: {gpu}; torch {torch.__version__}, cupy {cupy.__version__}")
        print(f"ceilings: fp16 GEMM {tflops:.0f} TFLOP/s, device copy {tbs:.2f} TB/s")
        flop = resnet50.flops(1, args.size)
        bflop = bert.flops(1, args.seq, layers=args.bert_layers)
        floors = {"resnet50": flop / (tflops * 1e12), bert_label(args): bflop / (tflops * 1e12)}
        print(f"ResNet-50 at {args.size}: {flop / 1e9:.2f} GFLOP/image; fp16 compute floor "
              f"{floors['resnet50'] * 1e6:.1f} us/image ({1 / floors['resnet50']:,.0f} img/s)")
        print(f"BERT-base, {args.bert_layers} layer(s) at seq {args.seq}: {bflop / 1e9:.2f} GFLOP/sequence; fp16 "
              f"compute floor {floors[bert_label(args)] * 1e6:.2f} us/sequence "
              f"({1 / floors[bert_label(args)]:,.0f} seq/s)", flush=True)
    table = Table(args.json, results)
    if "resnet50" in args.models:
        bench_resnet(args, table, torch, cupy)
    if "bert" in args.models and not args.torch_only:
        bench_bert(args, table, torch, cupy)
    if args.autotune_limit > 0:
        max_autotune(args, table)
    table.save()
    if not args.torch_only:
        print(f"\nGPU: {gpu}; % roofline = throughput x fp16 compute floor at {results['gemm_tflops']:.0f} TFLOP/s")
        table.print(floors)


if __name__ == "__main__":
    main()
