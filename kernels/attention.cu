// Attention ops over the KV window: write this step's k, v; single-query decode per head.
#include "common.cuh"

#define ATTN_THREADS 128   // launch with exactly this many threads per block
#define ATTN_MAX_HD 64

// k_cache[b, pos % W, c] = qkv[b, d + c]; v likewise.      one thread per (b, c); pos from meta
extern "C" __global__ void kv_write_f32(const float* __restrict__ qkv, i64 qkv_rs, float* __restrict__ k_cache,
                                        float* __restrict__ v_cache, i64 kv_rs, const i64* __restrict__ meta,
                                        i64 meta_rs, int B, int W, int d) {
  int idx = blockIdx.x * blockDim.x + threadIdx.x;
  if (idx >= B * d) return;
  int b = idx / d, c = idx % d;
  i64 slot = meta[b * meta_rs + META_POS] % W;
  k_cache[b * kv_rs + slot * d + c] = qkv[b * qkv_rs + d + c];
  v_cache[b * kv_rs + slot * d + c] = qkv[b * qkv_rs + 2 * d + c];
}

__device__ __forceinline__ float block_reduce(float v, float* red, bool is_max) {
  // fixed tree: warp shuffles, then warp 0 over the per-warp partials
  const int lane = threadIdx.x % 32, wid = threadIdx.x / 32, nw = blockDim.x / 32;
  for (int o = 16; o > 0; o >>= 1) {
    float u = __shfl_xor_sync(0xffffffffu, v, o);
    v = is_max ? fmaxf(v, u) : v + u;
  }
  if (lane == 0) red[wid] = v;
  __syncthreads();
  if (wid == 0) {
    v = lane < nw ? red[lane] : (is_max ? -INFINITY : 0.0f);
    for (int o = 16; o > 0; o >>= 1) {
      float u = __shfl_xor_sync(0xffffffffu, v, o);
      v = is_max ? fmaxf(v, u) : v + u;
    }
    if (lane == 0) red[0] = v;
  }
  __syncthreads();
  v = red[0];
  __syncthreads();
  return v;
}

// Split-K decode ("flash-decoding"): the T = min(kv_len + 1, W) valid slots are cut into fixed splits of
// ATTN_SPLIT slots. attn_partial_f32 runs one block per (b, h, split) and writes the split's max m,
// sum l and unnormalised output acc[hd]; attn_combine_f32 merges the splits of a (b, h) in split order.
// The split layout depends on W only, so the reduction order is the same for every batch size.
#define ATTN_SPLIT 128

// grid (B * H, n_splits); scores[b]: [H, W] scratch; part[b]: [H, n_splits, hd + 2] = (acc..., m, l)
extern "C" __global__ void attn_partial_f32(const float* __restrict__ qkv, i64 qkv_rs,
                                            const float* __restrict__ k_cache, const float* __restrict__ v_cache,
                                            i64 kv_rs, const i64* __restrict__ meta, i64 meta_rs,
                                            float* __restrict__ scores, i64 sc_rs, float* __restrict__ part,
                                            i64 part_rs, int B, int W, int d, int H) {
  __shared__ float red[32];
  __shared__ float grp[ATTN_THREADS];
  const int b = blockIdx.x / H, h = blockIdx.x % H, split = blockIdx.y, n_splits = gridDim.y;
  const int tid = threadIdx.x, nth = blockDim.x, hd = d / H;
  const i64 kv_len = meta[b * meta_rs + META_KV_LEN];
  const int T = (int)(kv_len + 1 < W ? kv_len + 1 : W);
  const int t0 = split * ATTN_SPLIT, t1 = t0 + ATTN_SPLIT < T ? t0 + ATTN_SPLIT : T;
  const float* q = qkv + b * qkv_rs + h * hd;
  const float* kb = k_cache + b * kv_rs + h * hd;
  const float* vb = v_cache + b * kv_rs + h * hd;
  float* s = scores + b * sc_rs + (i64)h * W;
  const float scale = 1.0f / sqrtf((float)hd);

  float m = -INFINITY;
  for (int t = t0 + tid; t < t1; t += nth) {
    float acc = 0.0f;
    for (int i = 0; i < hd; ++i) acc = fmaf(q[i], kb[(i64)t * d + i], acc);
    acc *= scale;
    s[t] = acc;
    m = fmaxf(m, acc);
  }
  m = block_reduce(m, red, true);
  float l = 0.0f;
  for (int t = t0 + tid; t < t1; t += nth) {
    float p = expf(fmaxf(s[t] - m, SCORE_FLOOR));
    s[t] = p;
    l += p;
  }
  l = block_reduce(l, red, false);  // its barriers also order the writes of s[] before the reads below
  // thread (group g, dim i) sums slots t0 + g, t0 + g + ng, ...; the groups are then added in order
  const int ng = nth / hd, g = tid / hd, i = tid % hd;
  float acc = 0.0f;
  if (g < ng)
    for (int t = t0 + g; t < t1; t += ng) acc = fmaf(s[t], vb[(i64)t * d + i], acc);
  grp[tid] = acc;
  __syncthreads();
  float* out = part + b * part_rs + ((i64)h * n_splits + split) * (hd + 2);
  if (tid < hd) {
    float o = 0.0f;
    for (int gg = 0; gg < ng; ++gg) o += grp[gg * hd + tid];
    out[tid] = o;
  }
  if (tid == 0) {
    out[hd] = m;      // -inf for an empty split
    out[hd + 1] = l;  // 0 for an empty split
  }
}

// out[b, h*hd + i] = sum_s acc_s[i] e^(m_s - M) / sum_s l_s e^(m_s - M).   grid B * H, block >= hd
extern "C" __global__ void attn_combine_f32(const float* __restrict__ part, i64 part_rs, float* __restrict__ out,
                                            i64 out_rs, int B, int d, int H, int n_splits) {
  const int b = blockIdx.x / H, h = blockIdx.x % H, i = threadIdx.x, hd = d / H;
  if (i >= hd) return;
  const float* p = part + b * part_rs + (i64)h * n_splits * (hd + 2);
  float M = -INFINITY;
  for (int sp = 0; sp < n_splits; ++sp) M = fmaxf(M, p[sp * (hd + 2) + hd]);
  float num = 0.0f, den = 0.0f;
  for (int sp = 0; sp < n_splits; ++sp) {
    const float* q = p + sp * (hd + 2);
    const float w = q[hd + 1] > 0.0f ? expf(q[hd] - M) : 0.0f;
    num = fmaf(q[i], w, num);
    den = fmaf(q[hd + 1], w, den);
  }
  out[b * out_rs + h * hd + i] = num / den;
}
