extern "C" __global__ void tt_pool(const T* __restrict__ x, T* __restrict__ y, IDX total) {
  for (IDX i = blockIdx.x * (IDX)blockDim.x + threadIdx.x; i < total; i += (IDX)gridDim.x * blockDim.x) {
    IDX r = i;
    int c = r % C; r /= C;
    int o2 = r % O2; r /= O2; int o1 = r % O1; r /= O1; int o0 = r % O0; IDX n = r / O0;
    A acc = INIT;
    int count = 0;
    bool padded = false;  // the window reaches into the padding
    for (int k0 = 0; k0 < K0; ++k0) {
      int s0 = o0 * ST0 + k0 - PD0;
      if (s0 < 0 || s0 >= S0) { padded = true; continue; }
      for (int k1 = 0; k1 < K1; ++k1) {
        int s1 = o1 * ST1 + k1 - PD1;
        if (s1 < 0 || s1 >= S1) { padded = true; continue; }
        for (int k2 = 0; k2 < K2; ++k2) {
          int s2 = o2 * ST2 + k2 - PD2;
          if (s2 < 0 || s2 >= S2) { padded = true; continue; }
          take(acc, x[(((n * S0 + s0) * S1 + s1) * S2 + s2) * C + c]);
          ++count;
        }
      }
    }
    y[i] = finish(acc, padded, count);
  }
}
