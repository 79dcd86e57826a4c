// Recurrent-state ops: short causal depthwise conv (conv_state) and the GRU cell (recurrent_state).
#include "common.cuh"

// Depthwise causal conv over the last k inputs, then x += silu(conv).     one thread per (b, c)
// conv_state[b]: [k-1, d], oldest first; w: [k, d]; b: [d]. conv_out[b, c] = silu(conv).
extern "C" __global__ void causal_conv_f32(float* __restrict__ x, i64 x_rs, float* __restrict__ conv_state,
                                           i64 cs_rs, const float* __restrict__ w, const float* __restrict__ bias,
                                           float* __restrict__ conv_out, i64 out_rs, int B, int d, int k) {
  int idx = blockIdx.x * blockDim.x + threadIdx.x;
  if (idx >= B * d) return;
  int b = idx / d, c = idx % d;
  float* st = conv_state + b * cs_rs;
  float xc = x[b * x_rs + c];
  float acc = xc * w[(i64)(k - 1) * d + c] + bias[c];
  for (int j = 0; j < k - 1; ++j) acc += st[(i64)j * d + c] * w[(i64)j * d + c];
  for (int j = 0; j < k - 2; ++j) st[(i64)j * d + c] = st[(i64)(j + 1) * d + c];
  st[(i64)(k - 2) * d + c] = xc;
  const float a = activate(acc, ACT_SILU);
  conv_out[b * out_rs + c] = a;
  x[b * x_rs + c] = xc + a;
}

// GRU cell, PyTorch gate order (r, z, n). w_ih: [I, 3H], w_hh: [H, 3H] (input-major).
// One warp per (b, j): lanes split the six dot products, a fixed shuffle tree sums them, lane 0 applies
// the gates. h_new[b, j] = n + z * (h - n).
extern "C" __global__ void gru_cell_f32(const float* __restrict__ x, i64 x_rs, const float* __restrict__ h,
                                        i64 h_rs, const float* __restrict__ w_ih, const float* __restrict__ w_hh,
                                        const float* __restrict__ b_ih, const float* __restrict__ b_hh,
                                        float* __restrict__ h_new, i64 hn_rs, int B, int I, int H) {
  const int warp = (blockIdx.x * blockDim.x + threadIdx.x) / 32, lane = threadIdx.x % 32;
  if (warp >= B * H) return;  // whole warps exit: blockDim is a multiple of 32
  const int b = warp / H, j = warp % H, G = 3 * H;
  const float* xb = x + b * x_rs;
  const float* hb = h + b * h_rs;
  float gi[3] = {0.0f, 0.0f, 0.0f}, gh[3] = {0.0f, 0.0f, 0.0f};
  for (int i = lane; i < I; i += 32) {
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
    h_new[b * hn_rs + j] = n + z * (hb[j] - n);
  }
}

// recurrent_state = h_new; x += h_new   (separate from the cell: every thread of the cell reads all of h)
extern "C" __global__ void gru_commit_f32(float* __restrict__ h, i64 h_rs, const float* __restrict__ h_new,
                                          i64 hn_rs, float* __restrict__ x, i64 x_rs, int B, int H) {
  int idx = blockIdx.x * blockDim.x + threadIdx.x;
  if (idx >= B * H) return;
  int b = idx / H, j = idx % H;
  float v = h_new[b * hn_rs + j];
  h[b * h_rs + j] = v;
  x[b * x_rs + j] += v;
}

// GRU over a whole sequence for cold prefill: hs[t] = GRU(x_t, hs[t-1]), h0 = 0, with the input gates
// gi[n, 3H] (b_ih included) precomputed by one GEMM. One block, one thread per hidden unit (blockDim a
// multiple of 32 >= H); h lives in shared memory and a barrier separates the steps.
#define GRU_SCAN_MAX_H 1024
extern "C" __global__ void gru_scan_f32(const float* __restrict__ gi, const float* __restrict__ w_hh,
                                        const float* __restrict__ b_hh, float* __restrict__ hs, int n, int H) {
  __shared__ float h[GRU_SCAN_MAX_H];
  const int j = threadIdx.x, G = 3 * H;
  if (j < H) h[j] = 0.0f;
  __syncthreads();
  for (int t = 0; t < n; ++t) {
    float hn = 0.0f;
    if (j < H) {
      float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f;
      for (int i = 0; i < H; ++i) {
        const float hi = h[i];
        const float* w = w_hh + (i64)i * G + j;
        s0 = fmaf(hi, w[0], s0);
        s1 = fmaf(hi, w[H], s1);
        s2 = fmaf(hi, w[2 * H], s2);
      }
      const float* g = gi + (i64)t * G;
      const float r = sigmoid_f(g[j] + s0 + b_hh[j]);
      const float z = sigmoid_f(g[H + j] + s1 + b_hh[H + j]);
      const float nn = tanhf(g[2 * H + j] + r * (s2 + b_hh[2 * H + j]));
      hn = nn + z * (h[j] - nn);
    }
    __syncthreads();
    if (j < H) {
      h[j] = hn;
      hs[(i64)t * H + j] = hn;
    }
    __syncthreads();
  }
}
