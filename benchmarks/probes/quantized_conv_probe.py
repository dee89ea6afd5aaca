"""Our Triton int8 / FP8 convolution (ops/triton_conv.py) against our FP16 convolutions, for every distinct
convolution of ResNet-50 v1.5 (tests/engine/gpu/gpu_resnet50.py) at one batch size: the quantized data flow
(quantized image, output and residual) next to each layer's best FP16 tactic (fp16 image, output and residual),
both timed through the backend's tuner, and the sums over the network's 53 convolutions. Each Triton shape is
also checked against another path on the same operands (fp16 residual, quantized output): the cuBLAS int8 GEMM,
or for FP8 cuDNN's E4M3 graph with our epilogue (steps counted in codes). GPU machine only.

    python benchmarks/probes/quantized_conv_probe.py [--batch 128] [--precision FP8] [--layers layer1.0.conv3,...]
    ncu -k conv_quantized python benchmarks/probes/quantized_conv_probe.py --only layer1.0.conv3 --tile 128,64,64,4,4,0
"""
from __future__ import annotations

import argparse
import collections
import os
import sys
import time


ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests", "engine", "gpu"))

import gpu_resnet50  # noqa: E402

from tftrt_py.engine import Network  # noqa: E402

RANGE = 3.0


def convolutions(batch: int):
    """(key, count, conv dict, input NHWC shape, has residual) for each distinct convolution."""
    model = gpu_resnet50.spec()
    found = collections.OrderedDict()

    def add(c, shape, residual):
        k = c["kernel"]
        key = (shape, k.shape, c["stride"], c["pad"], c["relu"], residual)
        if key in found:
            found[key][1] += 1
        else:
            found[key] = [key, 1, c, shape, residual]
        out = (shape[1] + 2 * c["pad"] - k.shape[0]) // c["stride"] + 1
        return (shape[0], out, out, k.shape[-1])

    y = add(model["stem"], (batch, 224, 224, 3), False)
    y = (batch, 56, 56, 64)  # after the max pool
    for c1, c2, c3, proj in model["blocks"]:
        if proj is not None:
            add(proj, y, False)
        y = add(c3, add(c2, add(c1, y, False), False), True)
    return list(found.values())


def layer_for(c, shape, residual):
    net = Network("probe")
    x = net.add_input("x", "float32", shape)
    x.dynamic_range = RANGE
    k = c["kernel"]
    out = (shape[0], (shape[1] + 2 * c["pad"] - k.shape[0]) // c["stride"] + 1,
           (shape[2] + 2 * c["pad"] - k.shape[1]) // c["stride"] + 1, k.shape[-1])
    params = dict(strides=[c["stride"]] * 2, dilations=[1, 1], pre_padding=[c["pad"]] * 2,
                  post_padding=[c["pad"]] * 2, groups=1)
    if c["relu"]:
        params["activation"] = {"type": "relu"}
    ins = [x] + ([net.add_input("r", "float32", out)] if residual else [])
    layer = net.add_layer("Convolution", ins, params, {"kernel": c["kernel"], "bias": c["bias"]}, name=c["name"])
    layer.outputs[0].dynamic_range = RANGE
    return layer, out


#: precision -> (format, environment variable forcing a path, the path checked against)
FORCE = {"INT8": ("TFTRT_PY_INT8_CONV", "gemm"), "FP8": ("TFTRT_PY_FP8_CONV", "conv")}


def quantized_spec(layer, shape, out, residual, fmt, opts, prefer=None, residual_dtype=None):
    """The Spec of `layer` in the quantized data flow of format `fmt` (the residual quantized unless
    `residual_dtype` says otherwise)."""
    from tftrt_py.engine.backends.cupy.ops import Spec, conv_fold
    from tftrt_py.engine.backends.cupy.ops.conv import ConvGeom

    s = fmt.scale(RANGE)
    qshape = shape[:3] + (fmt.channels(shape[3]),)
    folded = ((not fmt.keeps_nan or shape[3] < qshape[3])  # as the engine's stem (quant_planning._folds)
              and conv_fold.foldable(ConvGeom.of(layer, qshape, out)))
    if folded:
        qshape = conv_fold.folded_shape(qshape)
    return Spec(layer, [qshape] + ([out] if residual else []),
                [fmt.storage] + ([residual_dtype or fmt.storage] if residual else []), [out], [fmt.storage],
                "float16", opts, prefer, quant={"format": fmt.name, "in_scale": float(s), "res_scale": float(s),
                                                "folded": folded})


def run_one(layer, shape, out, residual, fmt, tile, opts, tuner, runs: int = 3):
    """One Triton kernel of the quantized data flow, run `runs` times (for a profiler)."""
    from tftrt_py.engine.backends.cupy.ops.conv import conv_candidates

    spec = quantized_spec(layer, shape, out, residual, fmt, opts, {"op": f"triton_conv_{fmt.name.lower()}",
                                                                    "tile": tile})
    op = conv_candidates(spec)[0]
    ins, outs = tuner._io(spec.in_shapes, spec.in_dtypes, spec.out_shapes, spec.out_dtypes)
    with opts.tuner.stream:
        for _ in range(runs):
            op.run(opts.tuner, ins, outs)
    opts.tuner.stream.synchronize()
    print(f"ran {layer.name} {op.tactic} x{runs}")


def l1_cached_copies():
    """Make Triton compile its 16-byte asynchronous copies as cp.async.ca (cached in L1; Triton always emits .cg
    for them, whatever the load's cache modifier): a 3x3 convolution reads each input pixel for 9 taps. Kernels
    go to a cache directory of their own."""
    from triton import knobs

    os.environ["TRITON_CACHE_DIR"] = os.path.join(os.environ.get("TMPDIR", "/tmp"), "triton-l1-cached")

    def hook(backend, stages, options, language, capability):
        make_ptx = stages["ptx"]
        stages["ptx"] = lambda src, metadata: make_ptx(src, metadata).replace("cp.async.cg.", "cp.async.ca.")

    knobs.runtime.add_stages_inspection_hook = hook


def main():
    import logging

    import cupy

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--precision", choices=sorted(FORCE), default="INT8")
    parser.add_argument("--only", help="run only this layer's Triton kernel (--tile) a few times, untimed (for ncu)")
    parser.add_argument("--layers", help="time only these convolutions (names, comma-separated)")
    parser.add_argument("--tile", help="BM,BN,BK,warps,stages,programs per SM (0: one per tile)")
    parser.add_argument("--tiles", help="kernels to compile instead of triton_conv.TILES: BM,BN,BK,warps,stages;...")
    parser.add_argument("--l1-cached", action="store_true",
                        help="compile the kernels' asynchronous copies to go through L1 (cp.async.ca), not L2 only")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    for name in ("ops.int8", "ops.fp8", "tactics"):
        logging.getLogger(f"tftrt_py.engine.backends.cupy.{name}").setLevel(logging.DEBUG)

    from tftrt_py.engine.backends import get_backend
    from tftrt_py.engine.backends.cupy.ops import BuildOptions, Spec, triton_conv
    from tftrt_py.engine.backends.cupy.ops.conv import conv_candidates
    from tftrt_py.engine.backends.cupy.ops.quant import FORMATS
    from tftrt_py.engine.backends.cupy.tactics import Tuner

    if args.l1_cached:
        l1_cached_copies()
    if args.tiles:
        triton_conv.TILES = tuple(tuple(int(v) for v in t.split(",")) for t in args.tiles.split(";"))
    fmt, (force, other) = FORMATS[args.precision], FORCE[args.precision]

    backend = get_backend("cupy")
    print(f"GPU {backend.device}; batch {args.batch}; {args.precision}")
    opts = BuildOptions(cudnn_plans=4, triton_tiles=len(triton_conv.TILES))  # every tile
    opts.tuner = backend._tuning_context()
    tuner = Tuner(opts.tuner, opts)
    rows, compile_s = [], 0.0
    totals = collections.Counter()
    for key, count, c, shape, residual in convolutions(args.batch):
        layer, out = layer_for(c, shape, residual)
        if args.layers and c["name"] not in args.layers.split(","):
            continue
        if args.only:
            if c["name"] == args.only:
                run_one(layer, shape, out, residual, fmt, [int(v) for v in args.tile.split(",")], opts, tuner)
            continue
        name = f"{c['name']} {shape[1]}x{shape[2]} {c['kernel'].shape[0]}x{c['kernel'].shape[0]}/{c['stride']} " \
               f"{shape[3]}->{out[3]}{' +res' if residual else ''}"
        fspec = Spec(layer, [shape] + ([out] if residual else []), ["float16"] * (2 if residual else 1), [out],
                     ["float16"], "float16", opts, None)
        f16 = tuner._time_all(fspec, conv_candidates(fspec))[0]
        totals["fp16"] += count * f16.ms
        tri_ms, tile, check = None, "", ""
        try:
            os.environ[force] = "triton"
            spec = quantized_spec(layer, shape, out, residual, fmt, opts)
            t0 = time.perf_counter()
            cands = conv_candidates(spec)
            compile_s += time.perf_counter() - t0
            if cands:
                best = tuner._time_all(spec, cands)[0]
                tri_ms, tile = best.ms, best.tactic["tile"]
                # check: fp16 residual, quantized output, against the other path on the same operands
                cspec = quantized_spec(layer, shape, out, residual, fmt, opts,
                                       {"op": best.tactic["op"], "tile": tile}, "float16")
                mine = conv_candidates(cspec)[0]
                os.environ[force] = other
                ref = conv_candidates(Spec(**{**cspec.__dict__, "prefer": None}))[0]
                ins, outs = tuner._io(cspec.in_shapes, cspec.in_dtypes, cspec.out_shapes, cspec.out_dtypes)
                opts.tuner.ensure_workspace(max(ref.workspace, 1))
                ref_out = cupy.empty_like(outs[0])
                with opts.tuner.stream:
                    mine.run(opts.tuner, ins, outs)
                    ref.run(opts.tuner, ins, [ref_out])
                opts.tuner.stream.synchronize()
                diff = cupy.abs(outs[0].astype(cupy.int32) - ref_out.astype(cupy.int32))
                check = f"max step {int(diff.max())}, {float((diff > 0).mean()) * 100:.3f}% differ"
        except Exception as exc:
            check = f"error {type(exc).__name__}: {str(exc)[:200]}"
        finally:
            os.environ.pop(force, None)
        totals["quantized"] += count * (tri_ms if tri_ms is not None else f16.ms)
        rows.append((name, count, f16.ms, f16.tactic.get("op"), tri_ms, tile, check))
        tuner.release()
        cupy.get_default_memory_pool().free_all_blocks()
    if args.only:
        return
    print(f"\nTriton compiles: {compile_s:.1f} s")
    print(f"\n{'convolution':<44} {'n':>2} {'fp16 ms':>8} {args.precision.lower() + ' ms':>8} {'ratio':>6}  "
          f"tile / fp16 op / check")
    for name, n, f, fop, t, tile, check in rows:
        ratio = f"{f / t:.2f}x" if t else "-"
        print(f"{name:<44} {n:>2} {f:8.4f} {t if t else float('nan'):8.4f} {ratio:>6}  {tile} / {fop} / {check}")
    print(f"\nsum over the {sum(n for _, n, *_ in rows)} convolutions: fp16 {totals['fp16']:.3f} ms, "
          f"{args.precision} data flow {totals['quantized']:.3f} ms ({totals['fp16'] / totals['quantized']:.2f}x; "
          f"layers without a Triton kernel counted at fp16)")


if __name__ == "__main__":
    main()
