extern "C" __global__ void tt_layer_norm(const T* __restrict__ x, const T* __restrict__ r, const float* __restrict__ g,
                                         const float* __restrict__ b, T* __restrict__ y, int len, float eps) {
  __shared__ float shared[32];
  long long base = (long long)blockIdx.x * len;
  float s = 0.0f;
  for (int l = threadIdx.x; l < len; l += blockDim.x) s += VALUE(base + l);
  float mean = tt_block_reduce(s, false, shared) / len;
  float q = 0.0f;
  for (int l = threadIdx.x; l < len; l += blockDim.x) { float d = VALUE(base + l) - mean; q += d * d; }
  float rstd = rsqrtf(tt_block_reduce(q, false, shared) / len + eps);
  for (int l = threadIdx.x; l < len; l += blockDim.x)
    y[base + l] = st<T>((VALUE(base + l) - mean) * rstd * g[l] + b[l]);
}
