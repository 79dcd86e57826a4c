"""The compiled CPU GEMVs as they were before rows shared weight loads (flashrt_ros/runtime/engine/cpu_kernels.py
at commit a86dd43), kept verbatim as the byte oracle of test_cpu_linear_bytes.py: one row at a time, each
output summed over the input index in order. Do not edit: the test's point is that the live kernels still
compute these exact bytes. One deliberate edit since: each product is summed by a fused multiply-add
(fma32), as in the live kernels."""
from __future__ import annotations

import numpy as np
from numba import njit

from flashrt_ros.runtime.engine.cpu_simd import fma32
from flashrt_ros.runtime.model.kernel_spec import ACT_RELU, ACT_SILU, ACT_TANH

_F0, _F1 = np.float32(0.0), np.float32(1.0)


@njit(cache=True, nogil=True)
def _act(v, act):
    if act == ACT_SILU:
        return v / (_F1 + np.exp(-v))
    if act == ACT_TANH:
        return np.tanh(v)
    if act == ACT_RELU:
        return max(v, _F0)
    return v


@njit(cache=True, nogil=True)
def gemv(x, w, y, n_in, n_out):
    """y[j] = sum_i x[i] w[i, j], i in order; each j its own accumulator (vectorised across j)."""
    for j in range(n_out):
        y[j] = _F0
    for i in range(n_in):
        xi = x[i]
        wi = w[i * n_out:(i + 1) * n_out]
        for j in range(n_out):
            y[j] = fma32(xi, wi[j], y[j])


@njit(cache=True, nogil=True)
def linear(x, w, bias, y, n_in, n_out, act):
    gemv(x, w, y, n_in, n_out)
    for j in range(n_out):
        y[j] = _act(y[j] + bias[j], act)


@njit(cache=True, nogil=True)
def gru_cell(x, h, w_ih, w_hh, b_ih, b_hh, gi, gh, h_new, n_in, H):
    linear(x, w_ih, b_ih, gi, n_in, 3 * H, 0)
    linear(h, w_hh, b_hh, gh, H, 3 * H, 0)
    for c in range(H):
        r = _F1 / (_F1 + np.exp(-(gi[c] + gh[c])))
        z = _F1 / (_F1 + np.exp(-(gi[H + c] + gh[H + c])))
        n = np.tanh(gi[2 * H + c] + gh[2 * H + c] * r)
        h_new[c] = (h[c] - n) * z + n

linear_ref, gru_cell_ref = linear, gru_cell
