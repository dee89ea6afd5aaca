extern "C" __global__ void tt_sdpa_masked_rows(const unsigned char* __restrict__ mask, int mb, int mh, int mq, int sk,
                                               int batch, int heads, int sq, int causal,
                                               const unsigned short* __restrict__ v, long long ldv, int dv,
                                               unsigned short* __restrict__ y) {
  int warp = (blockIdx.x * blockDim.x + threadIdx.x) >> 5, lane = threadIdx.x & 31;
  if (warp >= mb * mh * mq) return;
  const unsigned char* row = mask + (long long)warp * sk;
  int first = sk;
  for (int j = lane; j < sk; j += 32)
    if (row[j]) { first = j; break; }
  for (int o = 16; o > 0; o >>= 1) first = min(first, __shfl_xor_sync(0xffffffff, first, o));
  if (!causal && first < sk) return;
  int mi = warp % mq, mhi = (warp / mq) % mh, mbi = warp / (mq * mh);
  int i_lo = mq == 1 ? 0 : mi, i_hi = mq == 1 ? sq : mi + 1;
  if (causal) i_hi = min(i_hi, first);  // causal: query i's row is masked entirely when no key j <= i is kept
  if (i_lo >= i_hi) return;
  for (int b = mb == 1 ? 0 : mbi; b < (mb == 1 ? batch : mbi + 1); ++b)
    for (int h = mh == 1 ? 0 : mhi; h < (mh == 1 ? heads : mhi + 1); ++h)
      for (int c = lane; c < dv; c += 32) {
        float s = 0.0f;
        for (int j = 0; j < sk; ++j) s += ld(v[((long long)b * sk + j) * ldv + h * dv + c]);
        unsigned short mean = st<unsigned short>(s / sk);
        for (int i = i_lo; i < i_hi; ++i) y[((long long)b * sq + i) * heads * dv + h * dv + c] = mean;
      }
}
