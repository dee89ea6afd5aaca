#define NT (32 * WARPS)
#define BR (16 * WARPS)
#define BC 64
#define LDS (HD + 8)
typedef unsigned short half_t;

__device__ __forceinline__ unsigned tt_pack(float lo, float hi) {
  return (unsigned)st<unsigned short>(lo) | ((unsigned)st<unsigned short>(hi) << 16);
}

__device__ __forceinline__ void tt_mma(float* c, const unsigned* a, unsigned b0, unsigned b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
               "{%0,%1,%2,%3};"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ unsigned tt_shared(const void* p) {
  unsigned long long shared;
  asm("cvta.to.shared.u64 %0, %1;" : "=l"(shared) : "l"(p));
  return (unsigned)shared;
}

// Four 8x8 b16 tiles of shared memory (transposed with TRANS): lane l gives the address of row l % 8 of tile l / 8.
__device__ __forceinline__ void tt_ldmatrix_x4(unsigned* r, const half_t* row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(tt_shared(row)));
}
__device__ __forceinline__ void tt_ldmatrix_x4_trans(unsigned* r, const half_t* row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(tt_shared(row)));
}

// 16 bytes global -> shared without registers (zeros where !in: src then reads nothing).
__device__ __forceinline__ void tt_cp_async(half_t* dst, const half_t* src, bool in) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" :: "r"(tt_shared(dst)), "l"(src), "r"(in ? 16 : 0));
}
__device__ __forceinline__ void tt_cp_commit() { asm volatile("cp.async.commit_group;"); }
template <int N> __device__ __forceinline__ void tt_cp_wait() { asm volatile("cp.async.wait_group %0;" :: "n"(N)); }

// Key/value tile kv0 into stage buffers sk, sv, asynchronously.
__device__ __forceinline__ void tt_load_kv(half_t* sk, half_t* sv, const half_t* kb, const half_t* vb, int kv0,
                                           int sk_len, int ldk, int ldv, int tid) {
  for (int c = tid; c < BC * (HD / 8); c += NT) {
    int r = c / (HD / 8), col = (c % (HD / 8)) * 8;
    bool in = kv0 + r < sk_len;
    long long row = in ? kv0 + r : 0;
    tt_cp_async(sk + r * LDS + col, kb + row * ldk + col, in);
    tt_cp_async(sv + r * LDS + col, vb + row * ldv + col, in);
  }
}

// A mask the same for every query row (a padding mask): tile kv0's mask bytes into shared memory, read once
// per block instead of once per score.
__device__ __forceinline__ void tt_load_mask(unsigned char* sm, const unsigned char* mrow, long long msj, int kv0,
                                             int sk_len, int tid) {
  for (int c = tid; c < BC; c += NT) sm[c] = kv0 + c < sk_len ? mrow[(long long)(kv0 + c) * msj] : 0;
}

// A mask with a row per query (a causal-and-padding mask), rows 16-byte aligned, keys a multiple of 16: the
// tile's [BR, BC] mask bytes arrive by cp.async with the keys (rows LDM bytes apart: no bank conflicts).
#define LDM (BC + 16)
__device__ __forceinline__ void tt_load_row_mask(unsigned char* sm, const unsigned char* base, long long msi, int q0,
                                                 int kv0, int sq, int sk_len, int tid) {
  for (int c = tid; c < BR * (BC / 16); c += NT) {
    int r = c / (BC / 16), col = (c % (BC / 16)) * 16;
    bool in = q0 + r < sq && kv0 + col < sk_len;
    const unsigned char* src = base + (in ? (long long)(q0 + r) * msi + kv0 + col : 0);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" :: "r"(tt_shared(sm + r * LDM + col)), "l"(src),
                 "r"(in ? 16 : 0));
  }
}

// One block: BR query rows of one (batch, head) matrix, WARPS warps of 16 rows each.
extern "C" __global__ void __launch_bounds__(NT) tt_flash_attention(
    unsigned long long q_ptr, unsigned long long k_ptr, unsigned long long v_ptr, unsigned long long o_ptr,
    const unsigned char* __restrict__ mask, const long long* __restrict__ moff, long long msi, long long msj,
    int sq, int sk, int heads, int ldq, int ldk, int ldv, int ldo, float scale, float mask_value) {
  extern __shared__ __align__(16) unsigned char tt_smem[];
  half_t* sQ = (half_t*)tt_smem;
  half_t* sK = sQ + BR * LDS;       // two stages of key tiles: the next loads while this one computes
  half_t* sV = sK + 2 * BC * LDS;
  __shared__ unsigned char sM[2][BC];  // KEY_MASK: two stages of the key tiles' mask bytes
  __shared__ __align__(16) unsigned char sR[ROW_MASK ? 2 * BR * LDM : 16];  // ROW_MASK: two stages of mask tiles
  const float LOG2E = 1.4426950408889634f;
  int n = blockIdx.y, b = n / heads, h = n % heads, q0 = blockIdx.x * BR;
  const half_t* qb = (const half_t*)q_ptr + (long long)b * sq * ldq + h * HD;
  const half_t* kb = (const half_t*)k_ptr + (long long)b * sk * ldk + h * HD;
  const half_t* vb = (const half_t*)v_ptr + (long long)b * sk * ldv + h * HD;
  int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
  for (int c = tid; c < BR * (HD / 8); c += NT) {
    int r = c / (HD / 8), col = (c % (HD / 8)) * 8;
    bool in = q0 + r < sq;
    tt_cp_async(sQ + r * LDS + col, qb + (long long)(in ? q0 + r : 0) * ldq + col, in);
  }
  int kv_end = SKIP_ABOVE ? min(sk, q0 + BR) : sk;
  int tiles = (kv_end + BC - 1) / BC;
  if (tiles > 0) tt_load_kv(sK, sV, kb, vb, 0, sk, ldk, ldv, tid);
  if (ROW_MASK && tiles > 0) tt_load_row_mask(sR, mask + moff[n], msi, q0, 0, sq, sk, tid);
  if (KEY_MASK && tiles > 0) tt_load_mask(sM[0], mask + moff[n], msj, 0, sk, tid);
  tt_cp_commit();
  tt_cp_wait<0>();
  __syncthreads();
  int r0 = warp * 16 + g;
  unsigned qa[HD / 16][4];
#pragma unroll
  for (int kc = 0; kc < HD / 16; ++kc) {
    qa[kc][0] = *(const unsigned*)(sQ + r0 * LDS + kc * 16 + t4 * 2);
    qa[kc][1] = *(const unsigned*)(sQ + (r0 + 8) * LDS + kc * 16 + t4 * 2);
    qa[kc][2] = *(const unsigned*)(sQ + r0 * LDS + kc * 16 + t4 * 2 + 8);
    qa[kc][3] = *(const unsigned*)(sQ + (r0 + 8) * LDS + kc * 16 + t4 * 2 + 8);
  }
  float o[HD / 8][4];
#pragma unroll
  for (int dt = 0; dt < HD / 8; ++dt) o[dt][0] = o[dt][1] = o[dt][2] = o[dt][3] = 0.0f;
  float m[2] = {-TT_INF, -TT_INF}, l[2] = {0.0f, 0.0f};
  int rows[2] = {q0 + r0, q0 + r0 + 8};
  const unsigned char* mrow[2];
  if (HAS_MASK && !KEY_MASK && !ROW_MASK)
    for (int r = 0; r < 2; ++r) mrow[r] = mask + moff[n] + (long long)min(rows[r], sq - 1) * msi;
  for (int t = 0; t < tiles; ++t) {
    int kv0 = t * BC;
    half_t* tK = sK + (t & 1) * BC * LDS;
    half_t* tV = sV + (t & 1) * BC * LDS;
    if (t + 1 < tiles) {  // the next tile into the other stage (free: the loop's last barrier passed it)
      tt_load_kv(sK + ((t + 1) & 1) * BC * LDS, sV + ((t + 1) & 1) * BC * LDS, kb, vb, kv0 + BC, sk, ldk, ldv, tid);
      if (ROW_MASK) tt_load_row_mask(sR + ((t + 1) & 1) * BR * LDM, mask + moff[n], msi, q0, kv0 + BC, sq, sk, tid);
      tt_cp_commit();
      if (KEY_MASK) tt_load_mask(sM[(t + 1) & 1], mask + moff[n], msj, kv0 + BC, sk, tid);
    }
    if (t > 0) {  // this tile's loads (issued one iteration ago) done, the next one's may still run
      if (t + 1 < tiles) tt_cp_wait<1>(); else tt_cp_wait<0>();
      __syncthreads();
    }
    float s[BC / 8][4];
    // k's B fragments, two 16-wide column chunks at a time: ldmatrix of the 8x8 tiles (keys nt*8, columns kc*16
    // (+8, +16, +24)); lane l gives the row address of tile l / 8.
    const half_t* krow = tK + (lane & 7) * LDS + (lane >> 3) * 8;
#pragma unroll
    for (int nt = 0; nt < BC / 8; ++nt) {
      s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
#pragma unroll
      for (int kc = 0; kc < HD / 16; kc += 2) {
        unsigned b[4];
        tt_ldmatrix_x4(b, krow + nt * 8 * LDS + kc * 16);
        tt_mma(s[nt], qa[kc], b[0], b[1]);
        tt_mma(s[nt], qa[kc + 1], b[2], b[3]);
      }
    }
    float mx[2] = {m[0], m[1]};
#pragma unroll
    for (int nt = 0; nt < BC / 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        int j = kv0 + nt * 8 + t4 * 2 + (e & 1), i = rows[e >> 1];
        float x = s[nt][e] * scale;
        bool keep = true;
        if (CAUSAL) keep = j <= i;
        if (ROW_MASK) keep = keep && sR[((t & 1) * BR + r0 + (e >> 1) * 8) * LDM + nt * 8 + t4 * 2 + (e & 1)];
        else if (KEY_MASK) keep = keep && sM[t & 1][nt * 8 + t4 * 2 + (e & 1)];
        else if (HAS_MASK) keep = keep && (j >= sk || mrow[e >> 1][j * msj]);
        x = j >= sk ? -TT_INF : keep ? x : mask_value;
        s[nt][e] = x;
        mx[e >> 1] = fmaxf(mx[e >> 1], x);
      }
    float alpha[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffff, mx[r], 1));
      mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffff, mx[r], 2));
      alpha[r] = exp2f((m[r] - mx[r]) * LOG2E);
      m[r] = mx[r];
      l[r] *= alpha[r];
    }
#pragma unroll
    for (int nt = 0; nt < BC / 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float p = exp2f((s[nt][e] - m[e >> 1]) * LOG2E);
        s[nt][e] = p;
        l[e >> 1] += p;
      }
#pragma unroll
    for (int dt = 0; dt < HD / 8; ++dt) {
      o[dt][0] *= alpha[0]; o[dt][1] *= alpha[0]; o[dt][2] *= alpha[1]; o[dt][3] *= alpha[1];
    }
#pragma unroll
    for (int kc = 0; kc < BC / 16; ++kc) {
      unsigned pa[4] = {tt_pack(s[2 * kc][0], s[2 * kc][1]), tt_pack(s[2 * kc][2], s[2 * kc][3]),
                        tt_pack(s[2 * kc + 1][0], s[2 * kc + 1][1]), tt_pack(s[2 * kc + 1][2], s[2 * kc + 1][3])};
      // v's B fragments, two head columns of 8 at a time: ldmatrix.trans of the 8x8 tiles (keys kc*16 (+8),
      // columns dt*8 (+8)); lane l gives the row address of tile l / 8.
      const half_t* vrow = tV + (kc * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * LDS + (lane >> 4) * 8;
#pragma unroll
      for (int dt = 0; dt < HD / 8; dt += 2) {
        unsigned b[4];
        tt_ldmatrix_x4_trans(b, vrow + dt * 8);
        tt_mma(o[dt], pa, b[0], b[1]);
        tt_mma(o[dt + 1], pa, b[2], b[3]);
      }
    }
    __syncthreads();  // every warp is done with this stage before the next iteration loads into it
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l[r] += __shfl_xor_sync(0xffffffff, l[r], 1);
    l[r] += __shfl_xor_sync(0xffffffff, l[r], 2);
    if (rows[r] >= sq) continue;
    float inv = 1.0f / l[r];
    unsigned* out = (unsigned*)((half_t*)o_ptr + ((long long)b * sq + rows[r]) * ldo + h * HD + t4 * 2);
#pragma unroll
    for (int dt = 0; dt < HD / 8; ++dt) out[dt * 4] = tt_pack(o[dt][2 * r] * inv, o[dt][2 * r + 1] * inv);
  }
}
