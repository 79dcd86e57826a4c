// Attention ops over the KV window, read from the paged KV log through each row's page table.
//
// The log: k_log, v_log [n_pages, KV_PAGE, d], shared by every row and capsule. Position t of a row
// lives at (kv_pages[row][(t / KV_PAGE) % P], t % KV_PAGE), P = page-table slots per row. Every index
// is computed in unsigned arithmetic and reduced modulo its extent, so a corrupt meta or page table
// can give wrong numbers but never a read or write outside a buffer.
#include "common.cuh"

// ATTN_THREADS (threads per block, exactly), ATTN_MAX_HD and KV_PAGE (entries per log page = keys per
// attention split) come from runtime/model/kernel_spec.py as -D flags.

typedef unsigned long long u64;

__device__ __forceinline__ u64 log_page(const i64* pages, u64 ring, u64 n_pages) {
  return (u64)pages[ring] % n_pages;
}

// k_log[page, pos % KV_PAGE, c] = qkv[b, d + c]; v likewise.     one thread per (b, c); pos from meta
extern "C" __global__ void kv_write_f32(const float* __restrict__ qkv, i64 qkv_rs, float* __restrict__ k_log,
                                        float* __restrict__ v_log, i64 n_pages, const i64* __restrict__ meta,
                                        i64 meta_rs, const i64* __restrict__ kv_pages, i64 kv_pages_rs, int P,
                                        int B, int d) {
  int idx = blockIdx.x * blockDim.x + threadIdx.x;
  if (idx >= B * d) return;
  int b = idx / d, c = idx % d;
  const u64 pos = (u64)meta[b * meta_rs + META_POS];
  const u64 page = log_page(kv_pages + b * kv_pages_rs, (pos / KV_PAGE) % (u64)P, (u64)n_pages);
  const u64 at = (page * KV_PAGE + pos % KV_PAGE) * (u64)d + c;
  k_log[at] = qkv[b * qkv_rs + d + c];
  v_log[at] = qkv[b * qkv_rs + 2 * d + c];
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

// Split-K decode ("flash-decoding") by page: the window positions pos - T + 1 .. pos (T = min(kv_len + 1,
// W)) are cut at page boundaries; page-table slot j holds the positions t with (t / KV_PAGE) % P == j.
// attn_partial_f32 runs one block per (b, h, j) and writes the chunk's max m, sum l and unnormalised
// output acc[hd]; attn_combine_f32 merges the P chunks of a (b, h) in slot order. The partition depends on
// positions only, so the reduction order is the same for every batch size and wherever the pages sit.

// grid (B * H, P); scores[b]: [H, P * KV_PAGE] scratch; part[b]: [H, P, hd + 2] = (acc..., m, l)
extern "C" __global__ void attn_partial_f32(const float* __restrict__ qkv, i64 qkv_rs,
                                            const float* __restrict__ k_log, const float* __restrict__ v_log,
                                            i64 n_pages, const i64* __restrict__ meta, i64 meta_rs,
                                            const i64* __restrict__ kv_pages, i64 kv_pages_rs,
                                            float* __restrict__ scores, i64 scores_rs, float* __restrict__ part,
                                            i64 part_rs, int B, int kv_window, int d, int n_heads) {
  const int W = kv_window, H = n_heads;
  __shared__ float red[32];
  __shared__ float grp[ATTN_THREADS];
  const int b = blockIdx.x / H, h = blockIdx.x % H, j = blockIdx.y, P = gridDim.y;
  const int tid = threadIdx.x, nth = blockDim.x, hd = d / H;
  const u64 pos = (u64)meta[b * meta_rs + META_POS];
  const u64 kv_len = (u64)meta[b * meta_rs + META_KV_LEN];
  const u64 T = kv_len < (u64)W ? kv_len + 1 : (u64)W;  // unsigned: a negative kv_len clamps to W
  const u64 first = pos - T + 1;
  // the chunk of this slot: the one chunk c in [first / KV_PAGE, pos / KV_PAGE] with c % P == j
  const u64 c_lo = first / KV_PAGE, c_hi = pos / KV_PAGE;
  const u64 c = c_lo + ((u64)j + (u64)P - c_lo % (u64)P) % (u64)P;
  int s0 = 0, s1 = 0;  // slot range [s0, s1) of the window inside this chunk's page
  if (c <= c_hi) {
    s0 = c == c_lo ? (int)(first % KV_PAGE) : 0;
    s1 = c == c_hi ? (int)(pos % KV_PAGE) + 1 : KV_PAGE;
  }
  const u64 page = log_page(kv_pages + b * kv_pages_rs, (u64)j, (u64)n_pages);
  const float* q = qkv + b * qkv_rs + h * hd;
  const float* kb = k_log + page * KV_PAGE * (u64)d + h * hd;
  const float* vb = v_log + page * KV_PAGE * (u64)d + h * hd;
  float* s = scores + b * scores_rs + ((i64)h * P + j) * KV_PAGE;
  const float scale = 1.0f / sqrtf((float)hd);

  float m = -INFINITY;
  for (int t = s0 + tid; t < s1; t += nth) {
    float acc = 0.0f;
    for (int i = 0; i < hd; ++i) acc = fmaf(q[i], kb[(i64)t * d + i], acc);
    acc *= scale;
    s[t] = acc;
    m = fmaxf(m, acc);
  }
  m = block_reduce(m, red, true);
  float l = 0.0f;
  for (int t = s0 + tid; t < s1; t += nth) {
    float p = expf(fmaxf(s[t] - m, SCORE_FLOOR));
    s[t] = p;
    l += p;
  }
  l = block_reduce(l, red, false);  // its barriers also order the writes of s[] before the reads below
  // thread (group g, dim i) sums slots s0 + g, s0 + g + ng, ...; the groups are then added in order
  const int ng = nth / hd, g = tid / hd, i = tid % hd;
  float acc = 0.0f;
  if (g < ng)
    for (int t = s0 + g; t < s1; t += ng) acc = fmaf(s[t], vb[(i64)t * d + i], acc);
  grp[tid] = acc;
  __syncthreads();
  float* out = part + b * part_rs + ((i64)h * P + j) * (hd + 2);
  if (tid < hd) {
    float o = 0.0f;
    for (int gg = 0; gg < ng; ++gg) o += grp[gg * hd + tid];
    out[tid] = o;
  }
  if (tid == 0) {
    out[hd] = m;      // -inf for an empty chunk
    out[hd + 1] = l;  // 0 for an empty chunk
  }
}

// out[b, h*hd + i] = sum_s acc_s[i] e^(m_s - M) / sum_s l_s e^(m_s - M).   grid B * H, block >= hd
extern "C" __global__ void attn_combine_f32(const float* __restrict__ part, i64 part_rs, float* __restrict__ out,
                                            i64 out_rs, int B, int d, int n_heads, int P) {
  const int H = n_heads, n_splits = P;
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
