// Recurrent-state ops: short causal depthwise conv (conv_state) and the GRU cell (recurrent_state).
#include "common.cuh"

// Depthwise causal conv over the last k inputs, then x += silu(conv).     one thread per (b, c)
// conv_state[b]: [k-1, d], oldest first; w: [k, d]; b: [d]. conv_out[b, c] = silu(conv).
extern "C" __global__ void causal_conv_f32(float* __restrict__ x, i64 x_rs, float* __restrict__ conv_state,
                                           i64 conv_state_rs, const float* __restrict__ w, const float* __restrict__ bias,
                                           float* __restrict__ out, i64 out_rs, int B, int d, int k) {
  int idx = blockIdx.x * blockDim.x + threadIdx.x;
  if (idx >= B * d) return;
  int b = idx / d, c = idx % d;
  float* st = conv_state + b * conv_state_rs;
  float xc = x[b * x_rs + c];
  float acc = xc * w[(i64)(k - 1) * d + c] + bias[c];
  for (int j = 0; j < k - 1; ++j) acc += st[(i64)j * d + c] * w[(i64)j * d + c];
  for (int j = 0; j < k - 2; ++j) st[(i64)j * d + c] = st[(i64)(j + 1) * d + c];
  st[(i64)(k - 2) * d + c] = xc;
  const float a = activate(acc, ACT_SILU);
  out[b * out_rs + c] = a;
  x[b * x_rs + c] = xc + a;
}

// GRU cell, PyTorch gate order (r, z, n). w_ih: [I, 3H], w_hh: [H, 3H] (input-major).
// One warp per (b, j): lanes split the six dot products, a fixed shuffle tree sums them, lane 0 applies
// the gates. h_new[b, j] = n + z * (h - n).
extern "C" __global__ void gru_cell_f32(const float* __restrict__ x, i64 x_rs, const float* __restrict__ h,
                                        i64 h_rs, const float* __restrict__ w_ih, const float* __restrict__ w_hh,
                                        const float* __restrict__ b_ih, const float* __restrict__ b_hh,
                                        float* __restrict__ h_new, i64 h_new_rs, int B, int n_in, int H) {
  const int warp = (blockIdx.x * blockDim.x + threadIdx.x) / 32, lane = threadIdx.x % 32;
  if (warp >= B * H) return;  // whole warps exit: blockDim is a multiple of 32
  const int b = warp / H, j = warp % H, G = 3 * H;
  const float* xb = x + b * x_rs;
  const float* hb = h + b * h_rs;
  float gi[3] = {0.0f, 0.0f, 0.0f}, gh[3] = {0.0f, 0.0f, 0.0f};
  for (int i = lane; i < n_in; i += 32) {
    const float xi = xb[i];
    const float* w = w_ih + (i64)i * G + j;
    gi[0] = fmaf(xi, w[0], gi[0]);
    gi[1] = fmaf(xi, w[H], gi[1]);
    gi[2] = fmaf(xi, w[2 * H], gi[2]);
  }
  for (int i = lane; i < H; i += 32) {
    const float hi = hb[i];
    const float* w = w_hh + (i64)i * G + j;
    gh[0] = fmaf(hi, w[0], gh[0]);
    gh[1] = fmaf(hi, w[H], gh[1]);
    gh[2] = fmaf(hi, w[2 * H], gh[2]);
  }
  for (int g = 0; g < 3; ++g) {
    gi[g] = warp_sum(gi[g]) + b_ih[g * H + j];
    gh[g] = warp_sum(gh[g]) + b_hh[g * H + j];
  }
  if (lane == 0) {
    const float r = sigmoid_f(gi[0] + gh[0]);
    const float z = sigmoid_f(gi[1] + gh[1]);
    const float n = tanhf(gi[2] + r * gh[2]);
    h_new[b * h_new_rs + j] = n + z * (hb[j] - n);
  }
}

// recurrent_state = h_new; x += h_new   (separate from the cell: every thread of the cell reads all of h)
extern "C" __global__ void gru_commit_f32(float* __restrict__ h, i64 h_rs, const float* __restrict__ h_new,
                                          i64 h_new_rs, float* __restrict__ x, i64 x_rs, int B, int H) {
  int idx = blockIdx.x * blockDim.x + threadIdx.x;
  if (idx >= B * H) return;
  int b = idx / H, j = idx % H;
  float v = h_new[b * h_new_rs + j];
  h[b * h_rs + j] = v;
  x[b * x_rs + j] += v;
}

// GRU over a whole sequence for cold prefill: hs[t] = GRU(x_t, hs[t-1]), h0 = 0, with the input gates
// gi[n, 3H] (b_ih included) precomputed by one GEMM. One persistent block runs all n steps (one launch).
// Thread (j, s) = (tid / S, tid % S), S a power of two <= 32 (the host picks it: gru_scan_geometry in
// runtime/engine/launch_table.py), keeps rows i = s, s + S, ... of unit j's three W_hh columns in registers
// (GRU_SCAN_REG per gate; rows past those are read from global). The S lanes of a unit are adjacent in
// one warp: a fixed xor tree sums their partial dot products, and lane s = 0 applies the gates. h is
// double-buffered in shared memory, so one barrier per step suffices.
// GRU_SCAN_MAX_H comes from runtime/model/kernel_spec.py (a -D flag); a multiple of 32
#define GRU_SCAN_THREADS GRU_SCAN_MAX_H   // blockDim.x <= this (H * S rounded up to a warp)
#define GRU_SCAN_REG 22     // 3 x 22 weights: 128 registers at 512 threads with no spill (ptxas -v, sm_87 and sm_90)
extern "C" __global__ __launch_bounds__(GRU_SCAN_THREADS) void gru_scan_f32(
    const float* __restrict__ gi, const float* __restrict__ w_hh, const float* __restrict__ b_hh,
    float* __restrict__ hs, int n, int H, int S) {
  __shared__ float h[2][GRU_SCAN_MAX_H];
  const int tid = threadIdx.x, j = tid / S, s = tid % S, G = 3 * H;
  const bool unit = j < H;  // padding threads of the last warp still join every shuffle and barrier
  for (int i = tid; i < H; i += blockDim.x) h[0][i] = 0.0f;
  float wr[GRU_SCAN_REG], wz[GRU_SCAN_REG], wn[GRU_SCAN_REG];
#pragma unroll
  for (int k = 0; k < GRU_SCAN_REG; ++k) {
    const int i = s + k * S;
    const bool ok = unit && i < H;
    const float* w = w_hh + (i64)(ok ? i : 0) * G + (ok ? j : 0);
    wr[k] = ok ? w[0] : 0.0f;
    wz[k] = ok ? w[H] : 0.0f;
    wn[k] = ok ? w[2 * H] : 0.0f;
  }
  const float br = unit ? b_hh[j] : 0.0f, bz = unit ? b_hh[H + j] : 0.0f, bn = unit ? b_hh[2 * H + j] : 0.0f;
  __syncthreads();
  for (int t = 0; t < n; ++t) {
    const float* hc = h[t & 1];
    float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f;
#pragma unroll
    for (int k = 0; k < GRU_SCAN_REG; ++k) {
      const int i = s + k * S;
      const float hi = i < H ? hc[i] : 0.0f;
      s0 = fmaf(hi, wr[k], s0);
      s1 = fmaf(hi, wz[k], s1);
      s2 = fmaf(hi, wn[k], s2);
    }
    if (unit)
      for (int i = s + GRU_SCAN_REG * S; i < H; i += S) {  // wide H only: rows beyond the registers
        const float hi = hc[i];
        const float* w = w_hh + (i64)i * G + j;
        s0 = fmaf(hi, w[0], s0);
        s1 = fmaf(hi, w[H], s1);
        s2 = fmaf(hi, w[2 * H], s2);
      }
    for (int o = 1; o < S; o <<= 1) {
      s0 += __shfl_xor_sync(0xffffffffu, s0, o);
      s1 += __shfl_xor_sync(0xffffffffu, s1, o);
      s2 += __shfl_xor_sync(0xffffffffu, s2, o);
    }
    if (unit && s == 0) {
      const float* g = gi + (i64)t * G;
      const float r = sigmoid_f(g[j] + s0 + br);
      const float z = sigmoid_f(g[H + j] + s1 + bz);
      const float nn = tanhf(g[2 * H + j] + r * (s2 + bn));
      const float hn = nn + z * (hc[j] - nn);
      h[(t + 1) & 1][j] = hn;
      hs[(i64)t * H + j] = hn;
    }
    __syncthreads();  // step t's reads of h[t & 1] are done before step t + 1 writes it
  }
}
