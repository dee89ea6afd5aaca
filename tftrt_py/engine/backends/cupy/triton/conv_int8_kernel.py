"""The Triton source of the int8 implicit-GEMM convolution (imported only when Triton is installed).

NHWC int8 image [N, H, W, C] (C a multiple of BK, or below it) times int8 filters [COUT, KH, KW, C]:
output tiles [BM pixels, BN channels], int32 sums from Triton's int8 tensor-core dot over K = KH * KW * C in
steps of BK (a step never crosses a filter tap, so each step reads one input pixel per row), then the
epilogue of ops/int8.py's contract: y = act(acc * dq[c] + bias[c] + residual) rounded to fp16, stored as fp16
and/or requantized to int8 (q = clamp(rint(y * (1 / s)), -127, 127): the reciprocal, as cuDNN's fused graphs
requantize; an IEEE division per value would be a third of this kernel's instructions). The residual arrives
in fp16, as int8 with its scale, or in fp16 to be rounded to its int8 grid. Programs loop over tiles (a grid
smaller than the tile count makes the kernel persistent; the tile and step loops are flattened, so the next
tile's loads overlap this tile's epilogue).
"""
import triton
import triton.language as tl
from triton.language.extra import libdevice


@triton.jit
def _tile(tile, M, COUT, BM: tl.constexpr, BN: tl.constexpr, GROUP: tl.constexpr):
    """Row and channel offsets of output tile `tile` (grouped order: GROUP row tiles share the channel tiles)."""
    grid_m = tl.cdiv(M, BM)
    per_group = GROUP * tl.cdiv(COUT, BN)
    first = (tile // per_group) * GROUP
    rows = tl.minimum(grid_m - first, GROUP)
    pm = first + (tile % per_group) % rows
    pn = (tile % per_group) // rows
    return pm * BM + tl.arange(0, BM), pn * BN + tl.arange(0, BN)


@triton.jit
def _epilogue(acc, offs_m, offs_n, dq, bias, res, y, yq, M, COUT, res_scale, inv_out, HAS_BIAS: tl.constexpr,
              RES: tl.constexpr, RELU: tl.constexpr, OUT: tl.constexpr):
    m_ok = offs_m < M
    n_ok = offs_n < COUT
    v = acc.to(tl.float32) * tl.load(dq + offs_n, mask=n_ok, other=0.0)[None, :]
    if HAS_BIAS:
        v = v + tl.load(bias + offs_n, mask=n_ok, other=0.0)[None, :]
    out = offs_m[:, None] * COUT + offs_n[None, :]
    ok = m_ok[:, None] & n_ok[None, :]
    if RES == 1:
        v = v + tl.load(res + out, mask=ok, other=0.0).to(tl.float32)
    if RES == 2:
        v = v + tl.load(res + out, mask=ok, other=0).to(tl.float32) * res_scale
    if RES == 3:  # a float residual rounded to its int8 grid
        r = libdevice.rint(tl.math.div_rn(tl.load(res + out, mask=ok, other=0.0).to(tl.float32), res_scale))
        v = v + tl.minimum(tl.maximum(r, -127.0), 127.0) * res_scale
    if RELU:
        v = tl.where(v < 0.0, 0.0, v)  # NaN stays NaN, as TF's ReLU keeps it
    h = v.to(tl.float16)
    if OUT != 1:
        tl.store(y + out, h.to(y.dtype.element_ty), mask=ok)
    if OUT != 0:
        q = tl.minimum(tl.maximum(h.to(tl.float32) * inv_out, -127.0), 127.0)
        q = libdevice.float2int_rn(q).to(tl.int8)
        if OUT == 1:
            tl.store(y + out, q, mask=ok)
        else:
            tl.store(yq + out, q, mask=ok)


@triton.jit
def conv_int8(x, w, dq, bias, res, y, yq, M, H, W, OH, OW, C, COUT, res_scale, inv_out,
              KH: tl.constexpr, KW: tl.constexpr, SH: tl.constexpr, SW: tl.constexpr, PH: tl.constexpr,
              PW: tl.constexpr, HAS_BIAS: tl.constexpr, RES: tl.constexpr, RELU: tl.constexpr, OUT: tl.constexpr,
              BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP: tl.constexpr, SMALL_C: tl.constexpr):
    # RES: 0 none, 1 float, 2 int8 (scale res_scale), 3 float rounded to the int8 grid of res_scale.
    # OUT: 0 float y, 1 int8 y (scale 1 / inv_out), 2 both (y and yq).
    # SMALL_C: the channel count C when it is below BK (a stem's image): a step then spans BK // C filter taps.
    POINTWISE: tl.constexpr = KH == 1 and KW == 1 and SH == 1 and SW == 1 and PH == 0 and PW == 0
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    tiles = tl.cdiv(M, BM) * tl.cdiv(COUT, BN)
    per_tap = C // BK
    steps = KH * KW * per_tap
    offs_k = tl.arange(0, BK)
    done = pid - nprog
    for tile in tl.range(pid, tiles, nprog, flatten=True):
        offs_m, offs_n = _tile(tile, M, COUT, BM, BN, GROUP)
        rm = tl.where(offs_m < M, offs_m, 0)  # rows and channels past the end read row 0 (never stored)
        rn = tl.where(offs_n < COUT, offs_n, 0)
        w_rows = w + rn[None, :] * (KH * KW * C) + offs_k[:, None]
        ow = rm % OW
        oh = (rm // OW) % OH
        nb = rm // (OW * OH)
        acc = tl.zeros((BM, BN), dtype=tl.int32)
        if SMALL_C:
            K: tl.constexpr = KH * KW * SMALL_C
            for s in range(0, tl.cdiv(K, BK)):
                k = s * BK + offs_k
                tap = k // SMALL_C
                ih = (oh * SH - PH)[:, None] + (tap // KW)[None, :]
                iw = (ow * SW - PW)[:, None] + (tap % KW)[None, :]
                ok = (k < K)[None, :] & (ih >= 0) & (ih < H) & (iw >= 0) & (iw < W)
                a = tl.load(x + ((nb[:, None] * H + ih) * W + iw) * SMALL_C + (k % SMALL_C)[None, :], mask=ok,
                            other=0)
                b = tl.load(w + rn[None, :] * K + k[:, None], mask=(k < K)[:, None], other=0)
                acc = tl.dot(a, b, acc, out_dtype=tl.int32)
        else:
            for s in range(0, steps):
                if POINTWISE:
                    a = tl.load(x + rm[:, None] * C + s * BK + offs_k[None, :])
                else:
                    tap = s // per_tap
                    ih = oh * SH - PH + tap // KW
                    iw = ow * SW - PW + tap % KW
                    ok = (ih >= 0) & (ih < H) & (iw >= 0) & (iw < W)
                    pix = (nb * H + ih) * W + iw
                    a = tl.load(x + pix[:, None] * C + (s % per_tap) * BK + offs_k[None, :], mask=ok[:, None],
                                other=0)
                b = tl.load(w_rows + s * BK)
                acc = tl.dot(a, b, acc, out_dtype=tl.int32)
        done += nprog
        offs_m, offs_n = _tile(done, M, COUT, BM, BN, GROUP)
        _epilogue(acc, offs_m, offs_n, dq, bias, res, y, yq, M, COUT, res_scale, inv_out, HAS_BIAS, RES, RELU, OUT)
