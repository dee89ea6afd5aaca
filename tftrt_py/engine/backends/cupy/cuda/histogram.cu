// Calibration statistics of a float32 tensor on the device (calibration.calibrators' histograms): the largest
// |x| among its finite values, and the counts of its finite values in `bins` bins, x in bin min(|x| * scale,
// bins - 1) truncated, in float32 as the host computes them. Non-finite values (NaN, inf) are left out.

// The largest finite |x|, as the bits of a non-negative float, max-ed into *out (which starts at the bits of
// -1.0f: negative as an int, below every non-negative float's bits, so it stays when no value is finite).
extern "C" __global__ void tt_finite_abs_max(const float* __restrict__ x, long long n, int* out) {
    float m = -1.0f;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        float v = fabsf(x[i]);
        if (v <= 3.402823466e38f) m = fmaxf(m, v);  // false for NaN and inf
    }
    for (int offset = 16; offset > 0; offset >>= 1) m = fmaxf(m, __shfl_down_sync(0xffffffffu, m, offset));
    __shared__ float warps[32];
    if ((threadIdx.x & 31) == 0) warps[threadIdx.x >> 5] = m;
    __syncthreads();
    if (threadIdx.x < 32) {
        m = threadIdx.x < (blockDim.x + 31) / 32 ? warps[threadIdx.x] : -1.0f;
        for (int offset = 16; offset > 0; offset >>= 1) m = fmaxf(m, __shfl_down_sync(0xffffffffu, m, offset));
        if (threadIdx.x == 0 && m >= 0.0f) atomicMax(out, __float_as_int(m));
    }
}

// Counts in a block's shared memory (bins unsigned ints: dynamic shared memory of bins * 4 bytes), then added to
// the global counts: zeros after a ReLU, a large share of a tensor, would otherwise all meet on one global counter.
extern "C" __global__ void tt_bin_counts(const float* __restrict__ x, long long n, float scale, int bins,
                                         unsigned long long* counts) {
    extern __shared__ unsigned int local[];
    for (int b = threadIdx.x; b < bins; b += blockDim.x) local[b] = 0u;
    __syncthreads();
    const float last = (float)(bins - 1);
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        float v = fabsf(x[i]);
        if (v <= 3.402823466e38f) {
            v = fminf(v * scale, last);
            atomicAdd(&local[(int)v], 1u);
        }
    }
    __syncthreads();
    for (int b = threadIdx.x; b < bins; b += blockDim.x)
        if (local[b]) atomicAdd(&counts[b], (unsigned long long)local[b]);
}
