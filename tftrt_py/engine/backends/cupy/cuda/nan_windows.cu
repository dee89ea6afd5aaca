// The outputs of a convolution run on an E4M3 image folded by 2x2 pixel blocks, [N, H2, W2, 16 bytes], whose NaN
// pixels the quantize step wrote as NAN_PIXEL (conv_fold.NAN_PIXEL: channels 0, padding byte 1.0, a word no pixel
// quantized from finite values has, since their padding is 0): every output whose window in the unfolded
// convolution (KH x KW taps, strides SH, SW, padding PH, PW before) holds such a pixel is written NaN in all its
// COUT channels (y, and yq where the layer writes a quantized copy too), as the unfolded convolution computes it.
// A thread a folded pixel: without NaN pixels the step is one read of the image; with them, each writes the outputs
// its NaN pixels reach, 16 bytes a store (an image of NaN alone: every output about 16 times over).

// Output pixel o of `out` (channels COUT of type T) set to NaN (`word`: a 32-bit word of NaN values).
template <typename T>
__device__ __forceinline__ void write_nan(T* out, long long o, unsigned int word) {
  if ((COUT * sizeof(T)) % 16 == 0) {
    uint4* row = reinterpret_cast<uint4*>(out + o * COUT);
    for (int k = 0; k < (int)(COUT * sizeof(T) / 16); ++k) row[k] = make_uint4(word, word, word, word);
  } else {
    unsigned char* row = reinterpret_cast<unsigned char*>(out + o * COUT);
    for (int b = 0; b < (int)(COUT * sizeof(T)); ++b) row[b] = (word >> (8 * (b % 4))) & 0xff;
  }
}

extern "C" __global__ void tt_nan_windows(const int4* __restrict__ x, OUT_T* __restrict__ y, Q_T* __restrict__ yq,
                                          long long pixels) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < pixels;
       i += (long long)gridDim.x * blockDim.x) {
    int4 p = x[i];
    // sub-pixels (top row, bottom row) x (left, right) holding NaN
    int nan = (p.x == NAN_PIXEL) | (p.y == NAN_PIXEL) << 1 | (p.z == NAN_PIXEL) << 2 | (p.w == NAN_PIXEL) << 3;
    if (!nan) continue;
    int fw = i % W2;
    long long r = i / W2;
    int fh = r % H2;
    long long n = r / H2;
    // outputs o whose window holds input pixel j: o * S - P <= j <= o * S - P + K - 1
    int oh0[2], oh1[2], ow0[2], ow1[2];
#pragma unroll
    for (int s = 0; s < 2; ++s) {
      int ih = 2 * fh + s, iw = 2 * fw + s;
      int lh = ih + PH - KH + 1, lw = iw + PW - KW + 1;
      oh0[s] = lh <= 0 ? 0 : (lh + SH - 1) / SH;
      oh1[s] = min(OH - 1, (ih + PH) / SH);
      ow0[s] = lw <= 0 ? 0 : (lw + SW - 1) / SW;
      ow1[s] = min(OW - 1, (iw + PW) / SW);
    }
    for (int oh = min(oh0[0], oh0[1]); oh <= max(oh1[0], oh1[1]); ++oh)
      for (int ow = min(ow0[0], ow0[1]); ow <= max(ow1[0], ow1[1]); ++ow) {
        bool reached = false;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          int a = j / 2, b = j % 2;
          reached |= (nan >> j & 1) && oh0[a] <= oh && oh <= oh1[a] && ow0[b] <= ow && ow <= ow1[b];
        }
        if (!reached) continue;
        long long o = (n * OH + oh) * OW + ow;
        write_nan(y, o, OUT_NAN4);
#if DUAL
        write_nan(yq, o, Q_NAN4);
#endif
      }
  }
}
