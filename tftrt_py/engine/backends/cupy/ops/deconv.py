"""Deconvolution (transposed convolution): one cuBLAS GEMM of every input pixel with the whole
kernel, then a gather kernel summing the contributions of each output element (col2im)."""
from __future__ import annotations

from typing import List

import numpy as np

from tftrt_py.engine.backends.cupy import _device, kernels
from tftrt_py.engine.backends.cupy.ops.base import Op, Spec, align, pad3, register

__all__ = ["DeconvOp"]

_COL2IM = kernels.source("col2im.cu")


class DeconvOp(Op):
    def __init__(self, spec: Spec):
        cupy = _device.require()
        p, k = spec.params, spec.weights["kernel"]  # [*K, Cout, Cin]
        nsp = k.ndim - 2
        self.dtype = spec.cdt
        shape, out = spec.in_shapes[0], spec.out_shapes[0]
        self.pixels = int(np.prod(shape[:-1]))
        self.cin, self.cout, self.ks = shape[-1], k.shape[-2], int(np.prod(k.shape[:nsp]))
        # [Cin, Ks * Cout]: row c holds every kernel tap's output channels.
        wm = np.moveaxis(k, -1, 0).reshape(self.cin, self.ks * self.cout)
        self.w = cupy.asarray(np.ascontiguousarray(wm).astype(self.dtype))
        s, kk, o = pad3(shape[1:-1], 1), pad3(k.shape[:nsp], 1), pad3(out[1:-1], 1)
        st, pd = pad3(p["strides"], 1), pad3(p["pre_padding"], 0)
        defs = {"T": kernels.raw_type(self.dtype), "COUT": self.cout}
        for d in range(3):
            defs.update({f"S{d}": s[d], f"K{d}": kk[d], f"O{d}": o[d], f"ST{d}": st[d], f"PD{d}": pd[d]})
        head = "".join(f"#define {name} {value}\n" for name, value in defs.items())
        self.kernel = kernels.raw_kernel(head + _COL2IM, "tt_col2im")
        self.total = int(np.prod(out))
        self.workspace = align(self.pixels * self.ks * self.cout * np.dtype(self.dtype).itemsize)
        self.device_bytes = int(self.w.nbytes)
        self.allow_tf32 = spec.options.allow_tf32
        self.tactic = {"op": "gemm_col2im", "workspace": self.workspace}

    def run(self, rc, ins, outs):
        n = self.ks * self.cout
        rc.cublas.gemm(self.dtype, self.pixels, n, self.cin, ins[0].data.ptr, self.cin, False, self.w.data.ptr, n,
                       False, rc.workspace_ptr, n, allow_tf32=self.allow_tf32)
        kernels.launch(self.kernel, self.total, (rc.workspace, outs[0], kernels.i64(self.total)))


@register("Deconvolution")
def deconv_candidates(spec: Spec) -> List[Op]:
    return [DeconvOp(spec)]
