extern "C" __global__ void tt_arg_reduce(const T* __restrict__ x, int* __restrict__ y, long long rows, int len,
                                         long long inner) {
  for (long long r = blockIdx.x * (long long)blockDim.x + threadIdx.x; r < rows;
       r += (long long)gridDim.x * blockDim.x) {
    const T* p = x + (r / inner) * len * inner + r % inner;
    V best = START;
    int at = 0;
    for (int l = 0; l < len; ++l) { V v = LOAD(p[l * inner]); if (v BETTER best) { best = v; at = l; } }
    y[r] = at;
  }
}
