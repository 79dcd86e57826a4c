// Included by every kernel file. Under nvcc / NVRTC it only adds helpers; for the CPU test build
// the shim header (test/cuda_on_cpu/cpu_shim.h) is force-included first and defines CUDA_CPU_SHIM.
//
// Conventions (argument lists: flashrt_ros/runtime/model/kernel_spec.py, checked by test_kernel_specs.py):
//  - float32 everywhere, int64 meta; no cuBLAS (CuPy refuses it inside a graph capture).
//  - batched buffers are passed as (pointer to row 0, row stride in elements): state rows are views
//    into one slab, so their row stride is the slab row, not the buffer size.
//  - step-dependent values come from meta[row * meta_stride + META_*], never from arguments:
//    a CUDA graph freezes its arguments at capture.
//  - every reduction runs in a fixed order per row whatever the batch size (batch invariance).
#pragma once
#if !defined(__CUDACC__) && !defined(__CUDACC_RTC__) && !defined(CUDA_CPU_SHIM)
#error "compile with nvcc / NVRTC, or force-include cpu_shim.h"
#endif
#if defined(__CUDACC_RTC__)
  #define INFINITY __int_as_float(0x7f800000)
#elif defined(__CUDACC__)
  #include <cmath>
#endif

// The constants shared with Python (META_*, ACT_*, KV_PAGE, ATTN_*, GRU_SCAN_MAX_H, RMS_EPS, SCORE_FLOOR)
// are defined once, in runtime/model/kernel_spec.py, and passed as -D flags (cuda_defines()).
#if !defined(META_STEP) || !defined(ACT_SILU) || !defined(KV_PAGE) || !defined(SCORE_FLOOR)
#error "kernel constants missing: compile with flashrt_ros.runtime.model.kernel_spec.cuda_defines() as flags"
#endif

typedef long long i64;

__device__ __forceinline__ float sigmoid_f(float v) { return 1.0f / (1.0f + expf(-v)); }

__device__ __forceinline__ float activate(float v, int act) {
  if (act == ACT_SILU) return v / (1.0f + expf(-v));
  if (act == ACT_TANH) return tanhf(v);
  if (act == ACT_RELU) return v > 0.0f ? v : 0.0f;
  return v;
}

// Sum over the 32 lanes of a warp in a fixed xor-tree order; every lane gets the total.
__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
