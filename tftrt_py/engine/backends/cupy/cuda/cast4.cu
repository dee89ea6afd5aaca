struct alignas(4 * sizeof(TI)) In4 { TI v[4]; };
struct alignas(4 * sizeof(TO)) Out4 { TO v[4]; };
extern "C" __global__ void tt_cast4(const TI* __restrict__ x, TO* __restrict__ y, long long n) {
  long long step = (long long)gridDim.x * blockDim.x;
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; 4 * i < n; i += step) {
    if (4 * i + 3 < n) {
      In4 a = reinterpret_cast<const In4*>(x)[i];
      Out4 b;
      for (int j = 0; j < 4; ++j) b.v[j] = st<TO>(ld(a.v[j]));
      reinterpret_cast<Out4*>(y)[i] = b;
    } else {
      for (long long j = 4 * i; j < n; ++j) y[j] = st<TO>(ld(x[j]));
    }
  }
}
