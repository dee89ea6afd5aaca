extern "C" __global__ void tt_im2col(const T* __restrict__ x, T* __restrict__ cols, long long total) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total;
       i += (long long)gridDim.x * blockDim.x) {
    long long r = i;
    int ci = r % CG; r /= CG;
    int k2 = r % K2; r /= K2; int k1 = r % K1; r /= K1; int k0 = r % K0; r /= K0;
    int g = r % G; r /= G;
    int o2 = r % O2; r /= O2; int o1 = r % O1; r /= O1; int o0 = r % O0; long long n = r / O0;
    int s0 = o0 * ST0 + k0 * DL0 - PD0, s1 = o1 * ST1 + k1 * DL1 - PD1, s2 = o2 * ST2 + k2 * DL2 - PD2;
    T v = 0;
    if (s0 >= 0 && s0 < S0 && s1 >= 0 && s1 < S1 && s2 >= 0 && s2 < S2)
      v = x[(((n * S0 + s0) * S1 + s1) * S2 + s2) * C + g * CG + ci];
    cols[i] = v;
  }
}
