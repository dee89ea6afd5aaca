// A copy of an image with each pixel's C channels padded with zeros to CP (and converted from TI to TO): a
// thread a pixel, its CP values stored as one aligned vector (ALIGN bytes).
struct alignas(ALIGN) Pixel { TO v[CP]; };
extern "C" __global__ void tt_pad_channels(const TI* __restrict__ x, Pixel* __restrict__ y, long long pixels) {
  for (long long p = blockIdx.x * (long long)blockDim.x + threadIdx.x; p < pixels;
       p += (long long)gridDim.x * blockDim.x) {
    Pixel o;
#pragma unroll
    for (int c = 0; c < CP; ++c) o.v[c] = st<TO>(c < C ? ld(x[p * C + c]) : 0.0f);
    y[p] = o;
  }
}
