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

// GRU cell, PyTorch gate order (r, z, n). w_ih: [I, 3H], w_hh: [H, 3H] (input-major, so threads of
// neighbouring j read neighbouring weights). h_new[b, j] = n + z * (h - n).   one thread per (b, j)
extern "C" __global__ void gru_cell_f32(const float* __restrict__ x, i64 x_rs, const float* __restrict__ h,
                                        i64 h_rs, const float* __restrict__ w_ih, const float* __restrict__ w_hh,
                                        const float* __restrict__ b_ih, const float* __restrict__ b_hh,
                                        float* __restrict__ h_new, i64 hn_rs, int B, int I, int H) {
  int idx = blockIdx.x * blockDim.x + threadIdx.x;
  if (idx >= B * H) return;
  int b = idx / H, j = idx % H;
  const float* xb = x + b * x_rs;
  const float* hb = h + b * h_rs;
  const int G = 3 * H;
  float gi[3], gh[3];
  for (int g = 0; g < 3; ++g) {
    float si = 0.0f, sh = 0.0f;
    for (int i = 0; i < I; ++i) si = fmaf(xb[i], w_ih[(i64)i * G + g * H + j], si);
    for (int i = 0; i < H; ++i) sh = fmaf(hb[i], w_hh[(i64)i * G + g * H + j], sh);
    gi[g] = si + b_ih[g * H + j];
    gh[g] = sh + b_hh[g * H + j];
  }
  float r = sigmoid_f(gi[0] + gh[0]);
  float z = sigmoid_f(gi[1] + gh[1]);
  float n = tanhf(gi[2] + r * gh[2]);
  h_new[b * hn_rs + j] = n + z * (hb[j] - n);
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
