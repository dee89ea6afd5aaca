"""Which cuDNN int8 convolution graphs this GPU has, and how fast int8 runs next to fp16 for a few
ResNet-50 shapes at batch 128: each graph variant of ops/int8.py (plans, or why none), the fastest plan
of each, the cuBLAS int8 GEMM path and the FP16 convolution, timed through the backend's tuner.

    python benchmarks/probes/gpu_int8_probe.py
"""
from __future__ import annotations

import os
import sys
import traceback

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from tftrt_py.engine import Network  # noqa: E402

SHAPES = {  # name: (input NHWC, kernel, stride, pad, residual)
    "stem 7x7/2 (c 3->16 padded)": ((128, 224, 224, 16), (7, 7, 16, 64), 2, 3, False),
    "3x3 c64": ((128, 56, 56, 64), (3, 3, 64, 64), 1, 1, False),
    "1x1 c256->64": ((128, 56, 56, 256), (1, 1, 256, 64), 1, 0, False),
    "1x1 c64->256 +res": ((128, 56, 56, 64), (1, 1, 64, 256), 1, 0, True),
    "3x3 c256 14x14": ((128, 14, 14, 256), (3, 3, 256, 256), 1, 1, False),
}


def layer_for(shape, kshape, stride, pad, residual):
    net = Network("probe")
    x = net.add_input("x", "float32", shape)
    x.dynamic_range = 3.0
    rng = np.random.default_rng(0)
    params = dict(strides=[stride] * 2, dilations=[1, 1], pre_padding=[pad] * 2, post_padding=[pad] * 2, groups=1,
                  activation={"type": "relu"})
    weights = {"kernel": (rng.standard_normal(kshape) * 0.05).astype(np.float32),
               "bias": np.zeros(kshape[-1], np.float32)}
    ins = [x]
    if residual:
        out = (shape[0], shape[1] // stride, shape[2] // stride, kshape[-1])
        ins.append(net.add_input("r", "float32", out))
    layer = net.add_layer("Convolution", ins, params, weights, name="conv")
    layer.outputs[0].dynamic_range = 3.0
    return layer


def main():
    import logging

    import cupy

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("tftrt_py.engine.backends.cupy.ops.int8").setLevel(logging.DEBUG)

    from tftrt_py.engine.backends import get_backend
    from tftrt_py.engine.backends.cupy import _device
    from tftrt_py.engine.backends.cupy.ops import BuildOptions, Spec, int8
    from tftrt_py.engine.backends.cupy.ops.conv import conv_candidates
    from tftrt_py.engine.backends.cupy.tactics import Tuner

    backend = get_backend("cupy")
    cudnn = _device.cudnn_module()
    print(f"GPU {backend.device}; cuDNN backend {cudnn.backend_version() if cudnn else None}")
    opts = BuildOptions(cudnn_plans=4)
    opts.tuner = backend._tuning_context()
    tuner = Tuner(opts.tuner, opts)
    rows = []
    for name, (shape, kshape, stride, pad, residual) in SHAPES.items():
        layer = layer_for(shape, kshape, stride, pad, residual)
        out = tuple(layer.outputs[0].shape)
        flop = 2.0 * np.prod(out) * np.prod(kshape[:-1])
        for out_dtype in ("int8", "float16"):
            for variant in int8.INT8_FUSIONS + ("gemm",):
                os.environ["TFTRT_PY_INT8_CONV"] = variant
                in_shapes = [shape] + ([out] if residual else [])
                spec = Spec(layer, in_shapes, ["int8"] + (["float16"] if residual else []), [out], [out_dtype],
                            "float16", opts, None, quant={"in_scale": 3.0 / 127})
                try:
                    cands = conv_candidates(spec)
                    if not cands:
                        rows.append((name, out_dtype, variant, "no plans", ""))
                        continue
                    timed = tuner._time_all(spec, cands)
                    best = timed[0]
                    rows.append((name, out_dtype, variant, f"{best.ms:.3f} ms",
                                 f"{flop / best.ms / 1e9:.0f} TOPS, {len(timed)}/{len(cands)} ran"))
                except Exception as exc:
                    rows.append((name, out_dtype, variant, "error", f"{type(exc).__name__}: {str(exc)[:150]}"))
        os.environ.pop("TFTRT_PY_INT8_CONV", None)
        fspec = Spec(layer, [shape[:-1] + (kshape[2],)] + ([out] if residual else []),
                     ["float16"] * (2 if residual else 1), [out], ["float16"], "float16", opts, None)
        try:
            timed = tuner._time_all(fspec, conv_candidates(fspec))
            rows.append((name, "float16", "FP16 conv", f"{timed[0].ms:.3f} ms",
                         f"{flop / timed[0].ms / 1e9:.0f} TFLOPS {timed[0].tactic.get('op')}"))
        except Exception as exc:
            rows.append((name, "float16", "FP16 conv", "error", str(exc)[:150]))
        tuner.release()
        cupy.get_default_memory_pool().free_all_blocks()
    print(f"\n{'shape':<28} {'out':<8} {'variant':<10} {'time':>10}  note")
    for r in rows:
        print(f"{r[0]:<28} {r[1]:<8} {r[2]:<10} {r[3]:>10}  {r[4]}")


if __name__ == "__main__":
    try:
        main()
    except Exception:
        traceback.print_exc()
        sys.exit(1)
