extern "C" __global__ void tt_col2im(const T* __restrict__ prod, T* __restrict__ y, long long total) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total;
       i += (long long)gridDim.x * blockDim.x) {
    long long r = i;
    int c = r % COUT; r /= COUT;
    int o2 = r % O2; r /= O2; int o1 = r % O1; r /= O1; int o0 = r % O0; long long n = r / O0;
    float acc = 0.0f;
    for (int k0 = 0; k0 < K0; ++k0) {
      int f0 = o0 + PD0 - k0;
      if (f0 < 0 || f0 % ST0 != 0 || f0 / ST0 >= S0) continue;
      for (int k1 = 0; k1 < K1; ++k1) {
        int f1 = o1 + PD1 - k1;
        if (f1 < 0 || f1 % ST1 != 0 || f1 / ST1 >= S1) continue;
        for (int k2 = 0; k2 < K2; ++k2) {
          int f2 = o2 + PD2 - k2;
          if (f2 < 0 || f2 % ST2 != 0 || f2 / ST2 >= S2) continue;
          long long pix = ((n * S0 + f0 / ST0) * S1 + f1 / ST1) * S2 + f2 / ST2;
          acc += ld(prod[(pix * (K0 * K1 * K2) + (k0 * K1 + k1) * K2 + k2) * COUT + c]);
        }
      }
    }
    y[i] = st<T>(acc);
  }
}
