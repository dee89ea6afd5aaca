extern "C" __global__ void tt_quantize(const T* __restrict__ x, int* __restrict__ q, float s, long long groups) {
  // one thread per 4 output bytes (VEC8: 8): q is [OUTER, D1, D2P] (D2P % 4 == 0) read from x [OUTER, D2, D1]
  // (TRANSPOSE) or x [OUTER, D1, D2]; padding bytes are 0.
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < groups;
       i += (long long)gridDim.x * blockDim.x) {
#if VEC8  // fp16, no padding, no transpose, 8 | D2: eight halves in one 16-byte load, two words stored
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
