// Selective state-space mixer (a diagonal SSM with an input-dependent step, in the style of Mamba's
// selective scan). Per channel c, N states: with xn = rmsnorm(x) and proj = xn W_in + b_in =
// [dt_raw (d) | B (N) | C (N)] (ops before this kernel),
//   dt = softplus(dt_raw[c]),  h[c, s] = exp(-dt exp(a_log[c, s])) h[c, s] + dt xn[c] B[s],
//   y[c] = sum_s h[c, s] C[s] + d_skip[c] xn[c],  x[c] += y[c].
// exp(a_log) > 0 and dt > 0, so every state decays: h stays bounded. Sums over s run in order 0..N-1.
#include "common.cuh"

__device__ __forceinline__ float softplus_f(float v) { return v > 20.0f ? v : log1pf(expf(v)); }

// One step.                                                                      one thread per (b, c)
extern "C" __global__ void ssm_step_f32(float* __restrict__ x, i64 x_rs, const float* __restrict__ xn, i64 xn_rs,
                                        float* __restrict__ h, i64 h_rs, const float* __restrict__ proj, i64 proj_rs,
                                        const float* __restrict__ a_log, const float* __restrict__ d_skip, int B,
                                        int d, int N) {
  const int idx = blockIdx.x * blockDim.x + threadIdx.x;
  if (idx >= B * d) return;
  const int b = idx / d, c = idx % d;
  const float* p = proj + b * proj_rs;
  float* hc = h + b * h_rs + (i64)c * N;
  const float xc = xn[b * xn_rs + c], dt = softplus_f(p[c]), u = dt * xc;
  float y = 0.0f;
  for (int s = 0; s < N; ++s) {
    const float hs = expf(-(dt * expf(a_log[(i64)c * N + s]))) * hc[s] + u * p[d + s];
    hc[s] = hs;
    y += hs * p[d + N + s];
  }
  x[b * x_rs + c] += y + d_skip[c] * xc;
}

// The whole sequence for cold prefill, h0 = 0: y[t, c] (the residual update) for t = 0..n-1 and the final
// state h[c, :], from xn[n, d] and proj[n, d + 2N]. One thread per channel keeps its N states in registers.
extern "C" __global__ void ssm_scan_f32(const float* __restrict__ proj, const float* __restrict__ xn,
                                        const float* __restrict__ a_log, const float* __restrict__ d_skip,
                                        float* __restrict__ h, float* __restrict__ y, int n, int d, int N) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= d) return;
  float hs[SSM_MAX_N], a[SSM_MAX_N];
#pragma unroll
  for (int s = 0; s < SSM_MAX_N; ++s) {
    hs[s] = 0.0f;
    a[s] = s < N ? expf(a_log[(i64)c * N + s]) : 0.0f;
  }
  const i64 P = d + 2 * N;
  for (int t = 0; t < n; ++t) {
    const float* p = proj + t * P;
    const float xc = xn[(i64)t * d + c], dt = softplus_f(p[c]), u = dt * xc;
    float acc = 0.0f;
#pragma unroll
    for (int s = 0; s < SSM_MAX_N; ++s) {
      if (s < N) {
        hs[s] = expf(-(dt * a[s])) * hs[s] + u * p[d + s];
        acc += hs[s] * p[d + N + s];
      }
    }
    y[(i64)t * d + c] = acc + d_skip[c] * xc;
  }
#pragma unroll
  for (int s = 0; s < SSM_MAX_N; ++s)
    if (s < N) h[(i64)c * N + s] = hs[s];
}
