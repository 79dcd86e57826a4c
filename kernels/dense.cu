// Dense per-row ops: observation normalisation, linear (GEMV per row), residual add, RMSNorm.
#include "common.cuh"

// x[b, i] = (obs[b, i] - mean[i]) * inv_std[i]          one thread per (b, i)
extern "C" __global__ void obs_norm_f32(const float* __restrict__ obs, i64 obs_rs, const float* __restrict__ mean,
                                        const float* __restrict__ inv_std, float* __restrict__ x, i64 x_rs,
                                        int B, int n) {
  int idx = blockIdx.x * blockDim.x + threadIdx.x;
  if (idx >= B * n) return;
  int b = idx / n, i = idx % n;
  x[b * x_rs + i] = (obs[b * obs_rs + i] - mean[i]) * inv_std[i];
}

// y[b, o] = act(b[o] + sum_i x[b, i] * w[i, o])          w: [in, out] row-major
// One warp per (b, o): lanes split the inputs, then a fixed shuffle tree. Short dependency chains keep a
// single-row GEMV latency-friendly; the order per row does not depend on B (batch invariance).
extern "C" __global__ void linear_f32(const float* __restrict__ x, i64 x_rs, const float* __restrict__ w,
                                      const float* __restrict__ bias, float* __restrict__ y, i64 y_rs,
                                      int B, int n_in, int n_out, int act) {
  const int warp = (blockIdx.x * blockDim.x + threadIdx.x) / 32, lane = threadIdx.x % 32;
  if (warp >= B * n_out) return;  // whole warps exit: blockDim is a multiple of 32
  const int b = warp / n_out, o = warp % n_out;
  const float* xb = x + b * x_rs;
  float acc = 0.0f;
  for (int i = lane; i < n_in; i += 32) acc = fmaf(xb[i], w[(i64)i * n_out + o], acc);
  acc = warp_sum(acc);
  if (lane == 0) y[b * y_rs + o] = activate(acc + bias[o], act);
}

// x[b, i] += y[b, i]
extern "C" __global__ void add_f32(float* __restrict__ x, i64 x_rs, const float* __restrict__ y, i64 y_rs,
                                   int B, int n) {
  int idx = blockIdx.x * blockDim.x + threadIdx.x;
  if (idx >= B * n) return;
  int b = idx / n, i = idx % n;
  x[b * x_rs + i] += y[b * y_rs + i];
}

// y[b, :] = x[b, :] / sqrt(mean(x[b, :]^2) + eps) * g     one warp (32 threads) per row, fixed shuffle tree
extern "C" __global__ void rmsnorm_f32(const float* __restrict__ x, i64 x_rs, const float* __restrict__ g,
                                       float* __restrict__ y, i64 y_rs, int B, int n) {
  int b = blockIdx.x, lane = threadIdx.x;
  if (b >= B) return;
  const float* xb = x + b * x_rs;
  float ss = 0.0f;
  for (int i = lane; i < n; i += 32) ss = fmaf(xb[i], xb[i], ss);
  ss = warp_sum(ss);
  float inv = 1.0f / sqrtf(ss / (float)n + RMS_EPS);
  for (int i = lane; i < n; i += 32) y[b * y_rs + i] = xb[i] * inv * g[i];
}
