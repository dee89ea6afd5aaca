"""The Triton source of the INT8 and FP8 attention (imported only when Triton is installed).

Packed heads: q, k and v are int8 (or E4M3) rows with one scale each, head h in columns h * HD.. of each (q, k, v
column windows of one fused QKV projection's output, read in place). One program takes BM query rows of one (batch,
head) and walks the keys in tiles of BN with an online softmax (flash attention): scores q k^T summed exactly on
tensor cores (int32, or fp32 from E4M3), scaled, masked (a bool byte per score through per-(batch, head) offsets
and row/column strides, or one row of them a key tile where every query shares it; causal keeps keys j <= i;
masked scores become `mask_value`, so a fully masked row is a uniform softmax), exponentiated base 2; p (fp16)
times v (its int8 or E4M3 values in fp16, exact) summed in fp32. The output, times v's scale over the softmax
sum, is written as fp16, or quantized at its own scale (quantized_conv._quantize) for the quantized layer that
reads it. Scores of keys past the end weigh nothing.
"""
import triton
import triton.language as tl

from tftrt_py.engine.backends.cupy.triton.quantized_conv import _OFFSET, _offset_to_float, _quantize


@triton.jit
def _int8_to_fp16(x):
    """int8 values as fp16 without conversion instructions (a quarter of the arithmetic rate): the fp16 bits of
    1152 + x are 0x6480 + x (1024's exponent, 128 + x in the mantissa), less 1152 exactly."""
    return (x.to(tl.int16) + 0x6480).to(tl.float16, bitcast=True) - 1152.0


@triton.jit
def attention_quantized(q, k, v, y, mask, moff, si, sj, SQ, SK, H, ldq, ldk, ldv, qk_scale, v_scale, inv_out,
                        mask_value, HD: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, FP8: tl.constexpr,
                        OUT: tl.constexpr, MASKED: tl.constexpr, CAUSAL: tl.constexpr):
    # qk_scale: s_q * s_k * scale * log2(e) (scores in base 2); mask_value likewise times log2(e), finite.
    # OUT: 0 fp16 y, 1 quantized y (scale 1 / inv_out). MASKED: 0 none, 1 one mask row for every query (a padding
    # mask, read once a key tile), 2 a byte per score.
    pid = tl.program_id(0)
    blocks = tl.cdiv(SQ, BM)
    bh = pid // blocks
    b = bh // H
    h = bh % H
    rows = (pid % blocks) * BM + tl.arange(0, BM)
    d = tl.arange(0, HD)
    row_ok = rows < SQ
    qt = tl.load(q + (b * SQ + rows)[:, None] * ldq + h * HD + d[None, :], mask=row_ok[:, None], other=0.0)
    m_i = tl.full((BM,), float("-inf"), tl.float32)
    l_i = tl.zeros((BM,), tl.float32)
    acc = tl.zeros((BM, HD), tl.float32)
    if MASKED != 0:
        mrow = mask + tl.load(moff + bh)
    for start in range(0, SK, BN):
        keys = start + tl.arange(0, BN)
        key_ok = keys < SK
        kt = tl.load(k + (b * SK + keys)[None, :] * ldk + h * HD + d[:, None], mask=key_ok[None, :], other=0.0)
        if FP8:
            s = tl.dot(qt, kt)
        else:  # |sums| <= HD * 127**2 < 2**22: summed from _OFFSET, read as floats with one add
            s = _offset_to_float(tl.dot(qt, kt, tl.full((BM, BN), _OFFSET, tl.int32), out_dtype=tl.int32))
        s = s * qk_scale
        if MASKED == 1:
            keep = tl.load(mrow + keys * sj, mask=key_ok, other=1)
            s = tl.where(keep[None, :] != 0, s, mask_value)
        if MASKED == 2:
            keep = tl.load(mrow + rows[:, None] * si + keys[None, :] * sj, mask=row_ok[:, None] & key_ok[None, :],
                           other=1)
            s = tl.where(keep != 0, s, mask_value)
        if CAUSAL:
            s = tl.where(keys[None, :] <= rows[:, None], s, mask_value)
        s = tl.where(key_ok[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.math.exp2(m_i - m_new)
        p = tl.math.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        vt = tl.load(v + (b * SK + keys)[:, None] * ldv + h * HD + d[None, :], mask=key_ok[:, None], other=0.0)
        if FP8:
            vt = vt.to(tl.float16)
        else:
            vt = _int8_to_fp16(vt)
        acc = acc * alpha[:, None] + tl.dot(p.to(tl.float16), vt)
        m_i = m_new
    o = (acc * (v_scale / l_i)[:, None]).to(tl.float16)
    out = y + (b * SQ + rows)[:, None] * (H * HD) + h * HD + d[None, :]
    if OUT == 0:
        tl.store(out, o, mask=row_ok[:, None])
    else:
        tl.store(out, _quantize(o.to(tl.float32) * inv_out, FP8), mask=row_ok[:, None])
