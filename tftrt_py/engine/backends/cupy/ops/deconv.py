"""Deconvolution (transposed convolution): one cuBLAS GEMM of every input pixel with the whole
kernel, then a gather kernel summing the contributions of each output element (col2im)."""
from __future__ import annotations

from typing import List

import numpy as np

from tftrt_py.engine.backends.cupy import _device, kernels
from tftrt_py.engine.backends.cupy.ops.base import Op, Spec, align, pad3, register

__all__ = ["DeconvOp"]

_COL2IM = r"""
extern "C" __global__ void tt_col2im(const T* __restrict__ prod, T* __restrict__ y, long long total) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total;
       i += (long long)gridDim.x * blockDim.x) {
    long long r = i;
    int c = r % COUT; r /= COUT;
    int o2 = r % O2; r /= O2; int o1 = r % O1; r /= O1; int o0 = r % O0; long long n = r / O0;
    float acc = 0.0f;
    for (int k0 = 0; k0 < K0; ++k0) {
      int f0 = o0 + PD0 - k0;
      if (f0 < 0 || f0 % ST0 != 0 || f0 / ST0 >= S0) continue;
      for (int k1 = 0; k1 < K1; ++k1) {
        int f1 = o1 + PD1 - k1;
        if (f1 < 0 || f1 % ST1 != 0 || f1 / ST1 >= S1) continue;
        for (int k2 = 0; k2 < K2; ++k2) {
          int f2 = o2 + PD2 - k2;
          if (f2 < 0 || f2 % ST2 != 0 || f2 / ST2 >= S2) continue;
          long long pix = ((n * S0 + f0 / ST0) * S1 + f1 / ST1) * S2 + f2 / ST2;
          acc += ld(prod[(pix * (K0 * K1 * K2) + (k0 * K1 + k1) * K2 + k2) * COUT + c]);
        }
      }
    }
    y[i] = st<T>(acc);
  }
}
"""


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
