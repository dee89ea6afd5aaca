"""The Triton source of the int8 and FP8 implicit-GEMM convolution, also run on fp16 operands for FP16 layers
(imported only when Triton is installed).

NHWC image [N, H, W, C] (C a multiple of BK, or below it) times filters [COUT, KH, KW, C], both int8 (or E4M3
with FP8): output tiles [BM pixels, BN channels], int32 (fp32) sums from Triton's tensor-core dot over
K = KH * KW * C in steps of BK (a step never crosses a filter tap, so each step reads one input pixel per row),
then the epilogue of ops/int8.py's contract: y = act(acc * dq[c] + bias[c] + residual) rounded to fp16, stored
as fp16 and/or requantized (int8: q = clamp(rint(y * (1 / s)), -127, 127); FP8: the E4M3 value of y * (1 / s),
nearest even, saturated). By the reciprocal, as cuDNN's fused graphs requantize: an IEEE division per value
would be a third of this kernel's instructions. The residual arrives in fp16, quantized with its scale, or in
fp16 to be rounded to its quantized grid. Programs loop over tiles (a grid smaller than the tile count makes
the kernel persistent; the tile and step loops are flattened, so the next tile's loads overlap this tile's
epilogue). Where memory bounds a layer the epilogue's instruction count sets its speed (ncu, layer1's residual
1x1 of ResNet-50 at batch 128 on an H100: 45% of DRAM bandwidth, 0.66 instructions issued a cycle per scheduler
at 25% occupancy), so every instruction a value takes there counts: summing from _OFFSET and a ReLU that folds
into the fp16 conversion took that layer from 0.144 to 0.118 ms.
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


#: The bits of 1.5 * 2**23, a float of unit spacing: an int32 below 2**22 in magnitude added to them reads as
#: that float plus the integer.
_OFFSET = tl.constexpr(0x4B400000)


@triton.jit
def _offset_to_float(bits):
    """float(i) of int32 `bits` = i + _OFFSET (|i| < 2**22): the bits read as a float, less 1.5 * 2**23. Adds run
    at full rate where the conversion instruction runs at a quarter of it, and int8 epilogues are bound by
    instructions."""
    return bits.to(tl.float32, bitcast=True) - 12582912.0


@triton.jit
def _int_to_float(i):
    """float(i) of int32 values below 2**22 in magnitude (_offset_to_float)."""
    return _offset_to_float(i + _OFFSET)


@triton.jit
def _grid(v, FP8: tl.constexpr):
    """v (already divided by its scale) rounded to the quantized grid, in fp32: E4M3 (nearest even, saturated) or
    int8 (nearest even, clamped to +-127)."""
    if FP8:
        g = v.to(tl.float8e4nv).to(tl.float32)
    else:
        g = tl.minimum(tl.maximum(libdevice.rint(v), -127.0), 127.0)
    return g


@triton.jit
def _sums(BM: tl.constexpr, BN: tl.constexpr, FP8: tl.constexpr, SMALL_SUMS: tl.constexpr):
    """Zero sums of a BM x BN tile: fp32 (E4M3 or fp16 operands), int32 from _OFFSET where SMALL_SUMS (the
    epilogue then reads them as floats with one add), else int32."""
    if FP8:
        acc = tl.zeros((BM, BN), dtype=tl.float32)
    elif SMALL_SUMS:
        acc = tl.full((BM, BN), _OFFSET, tl.int32)
    else:
        acc = tl.zeros((BM, BN), dtype=tl.int32)
    return acc


@triton.jit
def _mma(a, b, acc, FP8: tl.constexpr):
    """acc + a @ b on tensor cores: int32 sums of int8, or fp32 sums of E4M3. Hopper adds FP8 products in a
    narrower accumulator (Triton's default there, as cuDNN's FP8 kernels): promoting each step's sums into fp32
    apart (max_num_imprecise_acc=BK) cost ResNet-50 7% at batch 128 on an H100 (3x3 layers 20%) and moved its
    logits from the numpy backend's by 3.1e-2 instead of 3.5e-2 (relative L2; 1.6e-2 and 1.8e-2 from fp32)."""
    if FP8:
        acc = tl.dot(a, b, acc)
    else:
        acc = tl.dot(a, b, acc, out_dtype=tl.int32)
    return acc


@triton.jit
def _quantize(v, FP8: tl.constexpr):
    """The quantized value of v (already divided by its scale): E4M3 (nearest even, saturated) or int8."""
    if FP8:
        q = v.to(tl.float8e4nv)
    else:  # adding 1.5 * 2**23 rounds to an integer (nearest even) in the low bits: the low byte is the int8
        q = (tl.minimum(tl.maximum(v, -127.0), 127.0) + 12582912.0).to(tl.int32, bitcast=True).to(tl.int8)
    return q


@triton.jit
def _requantize(h, inv, FP8: tl.constexpr, CLAMP16: tl.constexpr):
    """The quantized value of fp16 values h at scale 1 / inv. With CLAMP16 (INT8, 127 / inv a normal fp16 value)
    h is clamped in fp16 to +-fp16(127 / inv) (one packed instruction for two values) and h * inv + 1.5 * 2**23
    rounded in one fused multiply-add: rint(h * inv) clamped to +-127, as the bound times inv lies within 0.07 of
    127 (the product rounded once, where the quantize step divides; NaN gives -127 either way). BERT's FFN
    expansion, int8 out at batch 32 on an H100: 27.2 -> 25.6 us against clamping in fp32
    (benchmarks/probes/quantized_gemm_probe.py)."""
    if CLAMP16:
        bound = (127.0 / inv).to(tl.float16)
        h = tl.minimum(tl.maximum(h, -bound), bound)
        q = tl.fma(h.to(tl.float32), inv, 12582912.0).to(tl.int32, bitcast=True).to(tl.int8)
    else:
        q = _quantize(h.to(tl.float32) * inv, FP8)
    return q


@triton.jit
def _gelu(v):
    """GELU in the tanh form, as cuBLASLt's epilogue computes it for FP16 engines (cublaslt.REDUCED_GELU):
    0.5 v (1 + tanh(sqrt(2 / pi) (v + 0.044715 v^3))), tanh by the GPU's approximation (tanh.approx.f32: one
    instruction, within 2^-10.7 of tanh); NaN stays NaN. Six instructions a value: BERT's FFN expansion writes 12.6
    million at batch 32, and in the form by an exp and a division it took 29.9 us on an H100, 27.1 in this one."""
    u = v * (0.7978845608028654 + 0.0356774081363001 * v * v)
    t = tl.inline_asm_elementwise("tanh.approx.f32 $0, $1;", "=f,f", [u], dtype=tl.float32, is_pure=True, pack=1)
    h = 0.5 * v
    return h + h * t


@triton.jit
def _epilogue(acc, offs_m, offs_n, dq, bias, res, y, yq, M, COUT, res_scale, inv_out, HAS_BIAS: tl.constexpr,
              RES: tl.constexpr, ACT: tl.constexpr, OUT: tl.constexpr, FP8: tl.constexpr,
              SMALL_SUMS: tl.constexpr, CLAMP16: tl.constexpr):
    m_ok = offs_m < M
    n_ok = offs_n < COUT
    if SMALL_SUMS:
        v = _offset_to_float(acc)
    else:
        v = acc.to(tl.float32)
    v = v * tl.load(dq + offs_n, mask=n_ok, other=0.0)[None, :]
    if HAS_BIAS:
        v = v + tl.load(bias + offs_n, mask=n_ok, other=0.0)[None, :]
    out = offs_m[:, None] * COUT + offs_n[None, :]
    ok = m_ok[:, None] & n_ok[None, :]
    if RES == 1:
        v = v + tl.load(res + out, mask=ok, other=0.0).to(tl.float32)
    if RES == 2:
        r = tl.load(res + out, mask=ok, other=0.0)
        if FP8:
            r = r.to(tl.float32)
        else:
            r = _int_to_float(r.to(tl.int32))
        v = v + r * res_scale
    if RES == 3:  # a float residual rounded to its quantized grid
        v = v + _grid(tl.math.div_rn(tl.load(res + out, mask=ok, other=0.0).to(tl.float32), res_scale), FP8) * res_scale
    if ACT == 1:  # ReLU. NaN stays NaN, as TF's ReLU keeps it; ptxas folds it into the conversion to fp16 (cvt.relu)
        v = tl.maximum(v, 0.0, propagate_nan=tl.PropagateNan.ALL)
    if ACT == 2:
        v = _gelu(v)
    h = v.to(tl.float16)
    if OUT != 1:
        tl.store(y + out, h.to(y.dtype.element_ty), mask=ok)
    if OUT != 0:
        q = _requantize(h, inv_out, FP8, CLAMP16)
        if OUT == 1:
            tl.store(y + out, q, mask=ok)
        else:
            tl.store(yq + out, q, mask=ok)
        h = q
    return h  # what a next layer reads: the quantized values, or the fp16 ones where none are written


@triton.jit
def conv_quantized(x, w, dq, bias, res, y, yq, M, res_scale, inv_out, C: tl.constexpr, COUT: tl.constexpr,
                   H: tl.constexpr, W: tl.constexpr, OH: tl.constexpr, OW: tl.constexpr, KH: tl.constexpr,
                   KW: tl.constexpr, SH: tl.constexpr, SW: tl.constexpr, PH: tl.constexpr, PW: tl.constexpr,
                   HAS_BIAS: tl.constexpr, RES: tl.constexpr, ACT: tl.constexpr,
                   OUT: tl.constexpr, FP8: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                   GROUP: tl.constexpr, SMALL_C: tl.constexpr, SMALL_SUMS: tl.constexpr, CLAMP16: tl.constexpr):
    # FP8: x, w (and quantized residuals and outputs) hold E4M3 values (or x and w fp16 ones: an FP16 layer), summed
    # in fp32; else int8, summed in int32.
    # RES: 0 none, 1 float, 2 quantized (scale res_scale), 3 float rounded to the quantized grid of res_scale.
    # ACT: 0 none, 1 ReLU, 2 GELU (tanh form). OUT: 0 float y, 1 quantized y (scale 1 / inv_out), 2 both (y and yq).
    # SMALL_C: the channel count C when it is below BK (a stem's image): a step then spans BK // C filter taps.
    # SMALL_SUMS: int8 sums stay below 2**22 in magnitude (K * 127 * 127 does), so they are summed from _OFFSET.
    # CLAMP16: int8 outputs are clamped in fp16 (_requantize; their scale allows it).
    # Shapes bar the row count M are compiled in: a row's pixel and image come from divisions by them, which by a
    # runtime value are about twenty integer instructions each, and integer instructions bound this kernel.
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
        acc = _sums(BM, BN, FP8, SMALL_SUMS)
        if SMALL_C:
            K: tl.constexpr = KH * KW * SMALL_C
            for s in range(0, tl.cdiv(K, BK)):
                k = s * BK + offs_k
                tap = k // SMALL_C
                ih = (oh * SH - PH)[:, None] + (tap // KW)[None, :]
                iw = (ow * SW - PW)[:, None] + (tap % KW)[None, :]
                ok = (k < K)[None, :] & (ih >= 0) & (ih < H) & (iw >= 0) & (iw < W)
                a = tl.load(x + ((nb[:, None] * H + ih) * W + iw) * SMALL_C + (k % SMALL_C)[None, :], mask=ok,
                            other=0.0)
                b = tl.load(w + rn[None, :] * K + k[:, None], mask=(k < K)[:, None], other=0.0)
                acc = _mma(a, b, acc, FP8)
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
                                other=0.0)
                b = tl.load(w_rows + s * BK)
                acc = _mma(a, b, acc, FP8)
        done += nprog
        offs_m, offs_n = _tile(done, M, COUT, BM, BN, GROUP)
        _epilogue(acc, offs_m, offs_n, dq, bias, res, y, yq, M, COUT, res_scale, inv_out, HAS_BIAS, RES, ACT, OUT,
                  FP8, SMALL_SUMS, CLAMP16)


@triton.jit
def pointwise_chain(x, w, dq, bias, res, y, w2, dq2, bias2, y2, M, res_scale, inv_out, inv_out2, C: tl.constexpr,
                    COUT: tl.constexpr, C2: tl.constexpr, HAS_BIAS: tl.constexpr, RES: tl.constexpr,
                    ACT: tl.constexpr, OUT: tl.constexpr, HAS_BIAS2: tl.constexpr, ACT2: tl.constexpr,
                    OUT2: tl.constexpr, FP8: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                    FLAT: tl.constexpr, SMALL_SUMS: tl.constexpr, SMALL_SUMS2: tl.constexpr, CLAMP16: tl.constexpr,
                    CLAMP16_2: tl.constexpr):
    # Two 1x1 convolutions in a row, the second reading only the first's output (a bottleneck's last convolution
    # and the next block's first): y = conv(x) with conv_quantized's epilogue (RES, ACT; OUT 0 float or 1
    # quantized), y2 = conv2(y) with its own (no residual). A program takes BM rows at a time: y's COUT channels BN
    # at a time, each chunk stored and at once summed into the BM x C2 sums of y2 on chip, so y is written once and
    # never read back (ResNet-50's layer1 at batch 128 reads 103 MB less a block). w2 is [C2, COUT]. FLAT flattens
    # the row and chunk loops into one pipelined loop (the next rows' loads overlap this tile's second epilogue);
    # else, where one step covers the channels (C == BK), a tile's rows are read once for all of its chunks. Which
    # is faster depends on the format (ResNet-50 layer1 at batch 128 on an H200: flat for int8, nested for fp16).
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    offs_k = tl.arange(0, BK)
    offs_c2 = tl.arange(0, C2)
    ONCE: tl.constexpr = C == BK and not FLAT
    for tile in tl.range(pid, tl.cdiv(M, BM), nprog, flatten=FLAT):
        offs_m = tile * BM + tl.arange(0, BM)
        rm = tl.where(offs_m < M, offs_m, 0)
        acc2 = _sums(BM, C2, FP8, SMALL_SUMS2)
        if ONCE:
            a0 = tl.load(x + rm[:, None] * C + offs_k[None, :])
        for n0 in range(0, COUT, BN):
            offs_n = n0 + tl.arange(0, BN)
            acc = _sums(BM, BN, FP8, SMALL_SUMS)
            if ONCE:
                acc = _mma(a0, tl.load(w + offs_n[None, :] * C + offs_k[:, None]), acc, FP8)
            else:
                for s in range(0, C // BK):
                    a = tl.load(x + rm[:, None] * C + s * BK + offs_k[None, :])
                    acc = _mma(a, tl.load(w + offs_n[None, :] * C + s * BK + offs_k[:, None]), acc, FP8)
            v = _epilogue(acc, offs_m, offs_n, dq, bias, res, y, y, M, COUT, res_scale, inv_out, HAS_BIAS, RES, ACT,
                          OUT, FP8, SMALL_SUMS, CLAMP16)
            acc2 = _mma(v, tl.load(w2 + offs_c2[None, :] * COUT + offs_n[:, None]), acc2, FP8)
        _epilogue(acc2, offs_m, offs_c2, dq2, bias2, res, y2, y2, M, C2, 1.0, inv_out2, HAS_BIAS2, 0, ACT2, OUT2,
                  FP8, SMALL_SUMS2, CLAMP16_2)
