extern "C" __global__ void tt_softmax(const TI* __restrict__ x, TO* __restrict__ y, int len, long long inner) {
  __shared__ float shared[32];
  long long row = blockIdx.x;
  long long base = (row / inner) * len * inner + row % inner;
  float m = -TT_INF;
  for (int l = threadIdx.x; l < len; l += blockDim.x) m = fmaxf(m, ld(x[base + l * inner]));
  m = tt_block_reduce(m, true, shared);
  float s = 0.0f;
  for (int l = threadIdx.x; l < len; l += blockDim.x) s += expf(ld(x[base + l * inner]) - m);
  s = tt_block_reduce(s, false, shared);
  for (int l = threadIdx.x; l < len; l += blockDim.x)
    y[base + l * inner] = st<TO>(expf(ld(x[base + l * inner]) - m) / s);
}
