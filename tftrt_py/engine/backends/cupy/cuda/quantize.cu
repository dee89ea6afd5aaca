extern "C" __global__ void tt_quantize(const T* __restrict__ x, int* __restrict__ q, float s, long long groups) {
  // one thread per 4 output bytes (VEC8: 8, RGB4: 16): q is [OUTER, D1, D2P] (D2P % 4 == 0) read from
  // x [OUTER, D2, D1] (TRANSPOSE) or x [OUTER, D1, D2]; padding bytes are 0.
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < groups;
       i += (long long)gridDim.x * blockDim.x) {
#if RGB4  // float32 pixels of 3 channels, no transpose: four pixels (three 16-byte loads) to 4 bytes each
    const float4* p = reinterpret_cast<const float4*>(x) + 3 * i;
    float4 a = p[0], b = p[1], c = p[2];
    float v[12] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w, c.x, c.y, c.z, c.w};
    int words[4];
#pragma unroll
    for (int j = 0; j < 4; ++j)
      words[j] = (tt_q(v[3 * j], s) & 0xff) | ((tt_q(v[3 * j + 1], s) & 0xff) << 8) |
                 ((tt_q(v[3 * j + 2], s) & 0xff) << 16);
    reinterpret_cast<int4*>(q)[i] = make_int4(words[0], words[1], words[2], words[3]);
#elif VEC8  // fp16, no padding, no transpose, 8 | D2: eight halves in one 16-byte load, two words stored
    uint4 h = reinterpret_cast<const uint4*>(x)[i];
    unsigned int hw[4] = {h.x, h.y, h.z, h.w}, words[2] = {0, 0};
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      unsigned short b = (unsigned short)((hw[j / 2] >> (16 * (j % 2))) & 0xffff);
      words[j / 4] |= ((unsigned int)(tt_q(ld(b), s) & 0xff)) << (8 * (j % 4));
    }
    reinterpret_cast<uint2*>(q)[i] = make_uint2(words[0], words[1]);
#else
    unsigned int word = 0;
#if VEC4  // fp16, no padding, no transpose: four consecutive halves in one 8-byte load
    uint2 h = reinterpret_cast<const uint2*>(x)[i];
    unsigned short hs[4] = {(unsigned short)(h.x & 0xffff), (unsigned short)(h.x >> 16),
                            (unsigned short)(h.y & 0xffff), (unsigned short)(h.y >> 16)};
#pragma unroll
    for (int j = 0; j < 4; ++j) word |= ((unsigned int)(tt_q(ld(hs[j]), s) & 0xff)) << (8 * j);
#else
    long long e = i * 4;
    int c0 = e % D2P; long long r = e / D2P;
    int d1 = r % D1; long long o = r / D1;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      int c = c0 + j;
      int v = 0;
      if (c < D2) v = tt_q(ld(TRANSPOSE ? x[(o * D2 + c) * D1 + d1] : x[(o * D1 + d1) * D2 + c]), s);
      word |= ((unsigned int)(v & 0xff)) << (8 * j);
    }
#endif
    q[i] = (int)word;
#endif
  }
}
