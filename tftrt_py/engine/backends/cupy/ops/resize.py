"""Resize (TF's nearest and bilinear rules): source rows/columns and weights are computed once on
the host with the numpy backend's own helpers, then one gather kernel runs per call."""
from __future__ import annotations

from typing import List

import numpy as np

from tftrt_py.engine.backends.cupy import _device, kernels
from tftrt_py.engine.backends.cupy.ops.base import Op, Spec, register
from tftrt_py.engine.backends.cupy.ops.pointwise import C_TYPE

__all__ = ["ResizeOp"]

_NEAREST = """
long long c = i % C; long long r = i / C; int w = r % OW; r /= OW; int h = r % OH; long long n = r / OH;
y = x[((n * H + yi[h]) * W + xi[w]) * C + c];
"""
_LINEAR = """
long long c = i % C; long long r = i / C; int w = r % OW; r /= OW; int h = r % OH; long long n = r / OH;
long long r0 = (n * H + y0[h]) * W, r1 = (n * H + y1[h]) * W;
float tl = (float)x[(r0 + x0[w]) * C + c], tr = (float)x[(r0 + x1[w]) * C + c];
float bl = (float)x[(r1 + x0[w]) * C + c], br = (float)x[(r1 + x1[w]) * C + c];
float top = tl + (tr - tl) * xl[w];
float bottom = bl + (br - bl) * xl[w];
y = (OUT_T)(top + (bottom - top) * yl[h]);
"""


class ResizeOp(Op):
    def __init__(self, spec: Spec):
        from tftrt_py.engine.reference import linear_weights as _linear_weights, nearest_index as _nearest_index

        cupy = _device.require()
        p = spec.params
        (_, h, w, c), (oh, ow) = spec.in_shapes[0], p["sizes"]
        args = (p.get("align_corners", False), p.get("half_pixel_centers", False))
        in_dtype, out_dtype = spec.in_dtypes[0], spec.out_dtypes[0]
        defs = f"#define C {c}\n#define H {h}\n#define W {w}\n#define OH {oh}\n#define OW {ow}\n"
        defs += f"#define OUT_T {C_TYPE[out_dtype]}\n"
        if p["mode"] == "nearest":
            self.tables = [cupy.asarray(_nearest_index(h, oh, *args).astype(np.int32)),
                           cupy.asarray(_nearest_index(w, ow, *args).astype(np.int32))]
            self.kernel = kernels.elementwise(f"raw {in_dtype} x, raw int32 yi, raw int32 xi", f"{out_dtype} y",
                                              defs + _NEAREST, "tt_resize_nearest")
        else:
            y0, y1, yl = _linear_weights(h, oh, *args)
            x0, x1, xl = _linear_weights(w, ow, *args)
            self.tables = [cupy.asarray(a.astype(np.int32)) for a in (y0, y1, x0, x1)] + [
                cupy.asarray(yl.astype(np.float32)), cupy.asarray(xl.astype(np.float32))]
            self.kernel = kernels.elementwise(
                f"raw {in_dtype} x, raw int32 y0, raw int32 y1, raw int32 x0, raw int32 x1, raw float32 yl, "
                f"raw float32 xl", f"{out_dtype} y", defs + _LINEAR, "tt_resize_linear")
        self.device_bytes = sum(int(t.nbytes) for t in self.tables)
        self.tactic = {"op": "resize_" + p["mode"]}

    def run(self, rc, ins, outs):
        self.kernel(ins[0], *self.tables, outs[0])


@register("Resize")
def resize_candidates(spec: Spec) -> List[Op]:
    return [ResizeOp(spec)]
