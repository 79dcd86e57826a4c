// The third mixer of test_mixer_hooks.py (not shipped): a leaky integrator of the residual, per channel c
// k = a^2 / (1 + a^2), h += k (x - h), x += h. One thread per (row, channel).
typedef long long i64;

extern "C" __global__ void leaky_step_f32(float* __restrict__ x, i64 x_rs, float* __restrict__ h, i64 h_rs,
                                          const float* __restrict__ a, float* __restrict__ k, i64 k_rs, int B,
                                          int d) {
  int idx = blockIdx.x * blockDim.x + threadIdx.x;
  if (idx >= B * d) return;
  int b = idx / d, c = idx % d;
  float r = a[c] * a[c];
  float kc = r / (r + 1.0f);
  k[b * k_rs + c] = kc;
  float hc = h[b * h_rs + c];
  hc += kc * (x[b * x_rs + c] - hc);
  h[b * h_rs + c] = hc;
  x[b * x_rs + c] += hc;
}
