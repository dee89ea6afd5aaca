extern "C" __global__ void tt_pointers(const unsigned long long* __restrict__ offsets,
                                       unsigned long long* __restrict__ out, int n, unsigned long long q,
                                       unsigned long long k, unsigned long long s, unsigned long long p,
                                       unsigned long long v, unsigned long long y) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= 6 * n) return;
  unsigned long long base[6] = {q, k, s, p, v, y};
  out[i] = base[i / n] + offsets[i];
}
