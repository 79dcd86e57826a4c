// Output-side ops: temporal ensemble over pending action chunks, counter-based noise, meta advance.
#include "common.cuh"

// Ring-write this step's chunk into mtp_state[b, step % K], then blend the pending predictions for
// this step and map them to the robot's units:
// action[b, a] = (sum_age w(age) * ring[(step - age) % K][age * A + a] / sum w(age)) * scale[a] + offset[a],
// w(age) = exp(-decay * age) (decay > 0: the newest chunk counts most; < 0: the oldest, as ACT).
// One block per row (the ring write must be visible to the blend).
extern "C" __global__ void temporal_ensemble_f32(const float* __restrict__ chunk, i64 chunk_rs,
                                                 float* __restrict__ mtp_state, i64 mtp_state_rs,
                                                 const i64* __restrict__ meta, i64 meta_rs,
                                                 const float* __restrict__ scale, const float* __restrict__ offset,
                                                 float* __restrict__ action, i64 action_rs, int B, int K,
                                                 int A, float decay) {
  const int b = blockIdx.x;
  if (b >= B) return;
  // unsigned (as the NumPy twin's step % 2^62): a corrupt negative step can never index before the ring
  const unsigned long long step = (unsigned long long)meta[b * meta_rs + META_STEP] & ((1ull << 62) - 1);
  float* ring = mtp_state + b * mtp_state_rs;
  const int KA = K * A;
  for (int i = threadIdx.x; i < KA; i += blockDim.x) ring[(step % K) * KA + i] = chunk[b * chunk_rs + i];
  __syncthreads();
  for (int a = threadIdx.x; a < A; a += blockDim.x) {
    const int n = (int)(step + 1 < (unsigned long long)K ? step + 1 : K);
    float acc = 0.0f, wsum = 0.0f;
    for (int age = 0; age < n; ++age) {
      float w = expf(-decay * (float)age);
      acc += ring[((step - age) % K) * KA + age * A + a] * w;
      wsum += w;
    }
    // __fmul_rn / __fadd_rn: no contraction into an fma, so the rounding is the twins' (product, then sum)
    action[b * action_rs + a] = __fadd_rn(__fmul_rn(acc * (1.0f / wsum), scale[a]), offset[a]);
  }
}

__device__ __forceinline__ unsigned mix32(unsigned h) {
  h ^= h >> 16; h *= 0x85EBCA6Bu; h ^= h >> 13; h *= 0xC2B2AE35u; h ^= h >> 16;
  return h;
}

// Uniform in (0, 1) from a hash of (seed, counter, index, stream): the same bits as kernels.py.
__device__ __forceinline__ float rng_uniform(unsigned seed, unsigned long long counter, unsigned index,
                                             unsigned stream) {
  unsigned h = index * 0x9E3779B1u;
  h ^= seed * 0x632BE5ABu + (unsigned)counter * 0x27D4EB2Fu + stream * 0x165667B1u;
  h = mix32(h);
  h ^= (unsigned)(counter >> 32);
  h = mix32(h);
  return ((float)(h >> 8) + 0.5f) * (1.0f / 16777216.0f);
}

// action[b, a] += std * N(0, 1), Box-Muller, keyed by meta's rng_counter.    one thread per (b, a)
extern "C" __global__ void rng_noise_f32(float* __restrict__ action, i64 action_rs, const i64* __restrict__ meta,
                                         i64 meta_rs, int B, int A, unsigned seed, float std) {
  int idx = blockIdx.x * blockDim.x + threadIdx.x;
  if (idx >= B * A) return;
  int b = idx / A, a = idx % A;
  unsigned long long counter = (unsigned long long)meta[b * meta_rs + META_RNG];
  float u1 = rng_uniform(seed, counter, (unsigned)a, 0u);
  float u2 = rng_uniform(seed, counter, (unsigned)a, 1u);
  float z = sqrtf(-2.0f * logf(u1)) * cosf(6.2831853071795864f * u2);
  action[b * action_rs + a] += std * z;
}

// The last op of a step: step += 1, position += 1, kv_len = min(kv_len + 1, W), rng_counter += 1.
extern "C" __global__ void meta_advance_i64(i64* __restrict__ meta, i64 meta_rs, int B, int kv_window) {
  int b = blockIdx.x * blockDim.x + threadIdx.x;
  if (b >= B) return;
  i64* m = meta + b * meta_rs;
  m[META_STEP] += 1;
  m[META_POS] += 1;
  m[META_KV_LEN] = m[META_KV_LEN] + 1 < kv_window ? m[META_KV_LEN] + 1 : kv_window;
  m[META_RNG] += 1;
}
