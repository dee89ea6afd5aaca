// The word (one pixel's 4 bytes) that pixel p of an image [N * FOLD_H, D1, 4] lands on folded by 2x2 blocks into
// [N, FOLD_H / 2, D1 / 2, 16]: its block's pixel, then its row and column in the block.
__device__ __forceinline__ long long folded_word(long long p) {
#if FOLD_H
  int w = p % D1; long long o = p / D1; int h = o % FOLD_H; long long n = o / FOLD_H;
  return ((n * (FOLD_H / 2) + h / 2) * (D1 / 2) + w / 2) * 4 + (h & 1) * 2 + (w & 1);
#else
  return p;
#endif
}

// A pixel's three channels quantized into the low bytes of a word, its fourth byte (padding) 0. With NAN_FLAG (an
// E4M3 image folded for a stem, ops/conv_fold.py) a pixel holding NaN in any channel is written as NAN_PIXEL: its
// channels 0, its padding byte E4M3 1.0 (a word no finite pixel gives), which the convolution multiplies by a zero
// weight and its NaN-window step (nan_windows.cu) looks for (conv_fold.NAN_PIXEL).
__device__ __forceinline__ int pixel_word(float a, float b, float c, float s) {
#if NAN_FLAG
  if (isnan(a) || isnan(b) || isnan(c)) return NAN_PIXEL;
#endif
  return (tt_q(a, s) & 0xff) | ((tt_q(b, s) & 0xff) << 8) | ((tt_q(c, s) & 0xff) << 16);
}

extern "C" __global__ void tt_quantize(const T* __restrict__ x, int* __restrict__ q, float s, long long groups) {
  // one thread per 4 output bytes (VEC8: 8, RGB4: 16, folded 32): q is [OUTER, D1, D2P] (D2P % 4 == 0) read from
  // x [OUTER, D2, D1] (TRANSPOSE) or x [OUTER, D1, D2]; padding bytes are 0. FOLD_H: x is an image
  // [N * FOLD_H, W = D1, 4 channels], written as [N, FOLD_H / 2, W / 2, 16] (folded_word).
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < groups;
       i += (long long)gridDim.x * blockDim.x) {
#if RGB4  // float32 pixels of 3 channels, no transpose: four pixels (three 16-byte loads) to 4 bytes each
  // (folded: those of two rows, which make two neighbouring folded pixels, 32 bytes)
#if FOLD_H
    long long f = 2 * i;  // the first of the two folded pixels; D1 % 4 == 0, so both lie in one folded row
    long long first = 2 * (f / (D1 / 2)) * D1 + 2 * (f % (D1 / 2));  // its top-left pixel in the image
    const float4* rows[2] = {reinterpret_cast<const float4*>(x) + 3 * (first / 4),
                             reinterpret_cast<const float4*>(x) + 3 * ((first + D1) / 4)};
    int words[2][4];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float4* p = rows[r];
#else
    {
      const float4* p = reinterpret_cast<const float4*>(x) + 3 * i;
#endif
      float4 a = p[0], b = p[1], c = p[2];
      float v[12] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w, c.x, c.y, c.z, c.w};
#if FOLD_H
      int* w = words[r];
#else
      int w[4];
#endif
#pragma unroll
      for (int j = 0; j < 4; ++j) w[j] = pixel_word(v[3 * j], v[3 * j + 1], v[3 * j + 2], s);
#if !FOLD_H
      reinterpret_cast<int4*>(q)[i] = make_int4(w[0], w[1], w[2], w[3]);
#endif
    }
#if FOLD_H  // a folded pixel: (top row, bottom row) x (left, right)
    reinterpret_cast<int4*>(q)[f] = make_int4(words[0][0], words[0][1], words[1][0], words[1][1]);
    reinterpret_cast<int4*>(q)[f + 1] = make_int4(words[0][2], words[0][3], words[1][2], words[1][3]);
#endif
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
    bool nan = false;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      int c = c0 + j;
      int v = 0;
      if (c < D2) {
        float f = ld(TRANSPOSE ? x[(o * D2 + c) * D1 + d1] : x[(o * D1 + d1) * D2 + c]);
        nan = nan || isnan(f);
        v = tt_q(f, s);
      }
      word |= ((unsigned int)(v & 0xff)) << (8 * j);
    }
#if NAN_FLAG  // (folded: D2P is 4, so the word is one pixel)
    if (nan) word = NAN_PIXEL;
#endif
#endif
    q[FOLD_H ? folded_word(i) : i] = (int)word;  // folded: D2P is 4, a word a pixel
#endif
  }
}
