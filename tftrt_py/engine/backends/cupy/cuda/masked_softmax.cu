__device__ __forceinline__ float tt_score(const float* x, const unsigned char* mrow, long long sj, int i, int j,
                                          float mask_value) {
  bool keep = true;
  if (CAUSAL) keep = j <= i;
  if (HAS_MASK) keep = keep && mrow[j * sj];
  return keep ? x[j] : mask_value;
}

extern "C" __global__ void tt_masked_softmax(const float* __restrict__ x, TO* __restrict__ y, int len, int sq,
                                             const unsigned char* __restrict__ mask,
                                             const long long* __restrict__ moff, long long si, long long sj,
                                             float mask_value) {
  __shared__ float shared[32];
  long long row = blockIdx.x;
  int i = (int)(row % sq);
  const unsigned char* mrow = HAS_MASK ? mask + moff[row / sq] + i * si : mask;
  x += row * len;
  y += row * len;
  float m = -TT_INF;
  for (int l = threadIdx.x; l < len; l += blockDim.x) m = fmaxf(m, tt_score(x, mrow, sj, i, l, mask_value));
  m = tt_block_reduce(m, true, shared);
  float s = 0.0f;
  for (int l = threadIdx.x; l < len; l += blockDim.x) s += expf(tt_score(x, mrow, sj, i, l, mask_value) - m);
  s = tt_block_reduce(s, false, shared);
  for (int l = threadIdx.x; l < len; l += blockDim.x)
    y[l] = st<TO>(expf(tt_score(x, mrow, sj, i, l, mask_value) - m) / s);
}
