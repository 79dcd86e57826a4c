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

// y[b, o] = act(b[o] + sum_i x[b, i] * w[i, o])          w: [in, out] row-major; one thread per (b, o)
extern "C" __global__ void linear_f32(const float* __restrict__ x, i64 x_rs, const float* __restrict__ w,
                                      const float* __restrict__ bias, float* __restrict__ y, i64 y_rs,
                                      int B, int n_in, int n_out, int act) {
  int idx = blockIdx.x * blockDim.x + threadIdx.x;
  if (idx >= B * n_out) return;
  int b = idx / n_out, o = idx % n_out;
  const float* xb = x + b * x_rs;
  float acc = 0.0f;
  for (int i = 0; i < n_in; ++i) acc = fmaf(xb[i], w[(i64)i * n_out + o], acc);
  y[b * y_rs + o] = activate(acc + bias[o], act);
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
  for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
  float inv = 1.0f / sqrtf(ss / (float)n + RMS_EPS);
  for (int i = lane; i < n; i += 32) y[b * y_rs + i] = xb[i] * inv * g[i];
}
