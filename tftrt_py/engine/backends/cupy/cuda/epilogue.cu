// VEC consecutive elements per load and store (16 bytes where sizes and addresses allow, else 1).
struct alignas(VEC * sizeof(T)) Pack { T e[VEC]; };

extern "C" __global__ void tt_epilogue(const float* __restrict__ bias, const T* __restrict__ res, T* __restrict__ y,
                                       IDX packs) {
  for (IDX c = blockIdx.x * (IDX)blockDim.x + threadIdx.x; c < packs; c += (IDX)gridDim.x * blockDim.x) {
    IDX i = c * VEC;
    Pack yv = ((const Pack*)y)[c], rv = yv;
    if (HAS_RES) rv = ((const Pack*)res)[(i % RES_TOTAL) / VEC];
    int j = (int)(i % N);
#pragma unroll
    for (int e = 0; e < VEC; ++e) {
      float v = ld(yv.e[e]);
      if (HAS_BIAS) v += bias[j + e];
      if (HAS_RES) v += ld(rv.e[e]);
      yv.e[e] = st<T>(ACT);
    }
    ((Pack*)y)[c] = yv;
  }
}
