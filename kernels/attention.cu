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

// out[b, h*hd:(h+1)*hd] = softmax(q_h . K_h^T / sqrt(hd)) @ V_h over T = min(kv_len + 1, W) slots.
// One block of ATTN_THREADS per (b, h). scores[b]: [H, W] scratch holds the logits, then exp().
extern "C" __global__ void attn_decode_f32(const float* __restrict__ qkv, i64 qkv_rs,
                                           const float* __restrict__ k_cache, const float* __restrict__ v_cache,
                                           i64 kv_rs, const i64* __restrict__ meta, i64 meta_rs,
                                           float* __restrict__ out, i64 out_rs, float* __restrict__ scores,
                                           i64 sc_rs, int B, int W, int d, int H) {
  __shared__ float red[32];
  __shared__ float part[ATTN_THREADS];
  const int b = blockIdx.x / H, h = blockIdx.x % H, tid = threadIdx.x, nth = blockDim.x;
  const int hd = d / H;
  const i64 kv_len = meta[b * meta_rs + META_KV_LEN];
  const int T = (int)(kv_len + 1 < W ? kv_len + 1 : W);
  const float* q = qkv + b * qkv_rs + h * hd;
  const float* kb = k_cache + b * kv_rs + h * hd;
  const float* vb = v_cache + b * kv_rs + h * hd;
  float* s = scores + b * sc_rs + (i64)h * W;
  const float scale = 1.0f / sqrtf((float)hd);

  float m = -INFINITY;
  for (int t = tid; t < T; t += nth) {
    float acc = 0.0f;
    for (int i = 0; i < hd; ++i) acc = fmaf(q[i], kb[(i64)t * d + i], acc);
    acc *= scale;
    s[t] = acc;
    m = fmaxf(m, acc);
  }
  m = block_reduce(m, red, true);
  float l = 0.0f;
  for (int t = tid; t < T; t += nth) {
    float p = expf(fmaxf(s[t] - m, SCORE_FLOOR));
    s[t] = p;
    l += p;
  }
  l = block_reduce(l, red, false);  // also orders the writes of s[] before the reads below
  // output: thread (group g, dim i) sums slots t = g, g + ng, ...; groups are then added in order
  const int ng = nth / hd, g = tid / hd, i = tid % hd;
  float acc = 0.0f;
  if (g < ng)
    for (int t = g; t < T; t += ng) acc = fmaf(s[t], vb[(i64)t * d + i], acc);
  part[tid] = acc;
  __syncthreads();
  if (tid < hd) {
    float o = 0.0f;
    for (int gg = 0; gg < ng; ++gg) o += part[gg * hd + tid];
    out[b * out_rs + h * hd + tid] = o / l;
  }
}
