// Each row of LEN elements is read once into registers (ITEMS vectors of VEC elements, 16 bytes, per thread), its
// mean and variance taken from them, its output written once. WARP_ROWS: one warp per row (shuffle reductions
// only, blockDim.x / 32 rows per block); else one block per row.
union tt_vec { uint4 u; T e[VEC]; };
__device__ __forceinline__ float tt_row_sum(float v, float* shared) {
#if WARP_ROWS
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffff, v, o);
  return v;
#else
  return tt_block_reduce(v, false, shared);
#endif
}
extern "C" __global__ void tt_row_norm(const T* __restrict__ x, const T* __restrict__ r, const float* __restrict__ g,
                                       const float* __restrict__ b, T* __restrict__ y, float eps, long long rows
#if QUANT  // the output also quantized (tt_q with scale qs: quant.QuantizeOp's bytes), VEC bytes a vector
                                       , unsigned int* __restrict__ yq, float qs
#endif
                                       ) {
  __shared__ float shared[32];
#if WARP_ROWS
  long long row = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
  int t = threadIdx.x & 31, nt = 32;
  if (row >= rows) return;  // the whole warp
#else
  long long row = blockIdx.x;
  int t = threadIdx.x, nt = blockDim.x;
#endif
  long long base = row * LEN;
  float v[ITEMS][VEC];
  float s = 0.0f;
#pragma unroll
  for (int it = 0; it < ITEMS; ++it) {
    int c = (it * nt + t) * VEC;
    tt_vec a, o;
    a.u = o.u = make_uint4(0, 0, 0, 0);
    if (c < LEN) {
      a.u = *(const uint4*)(x + base + c);
      if (RESIDUAL) o.u = *(const uint4*)(r + base + c);
    }
#pragma unroll
    for (int e = 0; e < VEC; ++e) { v[it][e] = ld(a.e[e]) + (RESIDUAL ? ld(o.e[e]) : 0.0f); s += v[it][e]; }
  }
  float mean = tt_row_sum(s, shared) / LEN;
  float q = 0.0f;
#pragma unroll
  for (int it = 0; it < ITEMS; ++it)
    if ((it * nt + t) * VEC < LEN)
#pragma unroll
      for (int e = 0; e < VEC; ++e) { float d = v[it][e] - mean; q += d * d; }
  float rstd = rsqrtf(tt_row_sum(q, shared) / LEN + eps);
#pragma unroll
  for (int it = 0; it < ITEMS; ++it) {
    int c = (it * nt + t) * VEC;
    if (c >= LEN) continue;
    tt_vec out;
    float gc[VEC], bc[VEC];  // scale and bias as 16-byte loads (VEC is 4 or 8 floats)
#pragma unroll
    for (int e = 0; e < VEC; e += 4) {
      *(float4*)(gc + e) = *(const float4*)(g + c + e);
      *(float4*)(bc + e) = *(const float4*)(b + c + e);
    }
#pragma unroll
    for (int e = 0; e < VEC; ++e) out.e[e] = st<T>((v[it][e] - mean) * rstd * gc[e] + bc[e]);
    *(uint4*)(y + base + c) = out.u;
#if QUANT
    unsigned int words[VEC / 4];
#pragma unroll
    for (int w = 0; w < VEC / 4; ++w) {
      words[w] = 0;
#pragma unroll
      for (int j = 0; j < 4; ++j) words[w] |= ((unsigned int)(tt_q(ld(out.e[4 * w + j]), qs) & 0xff)) << (8 * j);
    }
#if VEC == 8
    *(uint2*)(yq + (base + c) / 4) = make_uint2(words[0], words[1]);
#else
    yq[(base + c) / 4] = words[0];
#endif
#endif
  }
}
