"""The compiled CPU step: every kernel of kernels.py as a numba function over one row, registered under its
spec's name (cpu_registry.py), and ``run_program``, generated from that registry, which runs a whole encoded
plan (all ops, all rows of a range) in one nogil call (cpu_backend.py encodes it).

Every reduction runs per row in an order fixed by the code and the config alone: a GEMV sums over its
input index in order (vectorised across outputs, each with its own accumulator; the rows of a batch share
each weight load), an attention score sums its head's channels in order (vectorised across slots), softmax
and value sums run over slots in order (values vectorised across channels), chunks are the page slots by
absolute position and combine in slot order. Nothing depends on the batch size or on which rows share a
page, so a branch of a batch is byte-identical to that row stepped alone. No ``fastmath``: the compiler may
vectorise across independent accumulators but never reassociate a sum. Nothing here allocates.

Buffers arrive as slices of four flat float32 regions (the small slab, the work slab, the weights, the KV
log) and one int64 view of the small slab (meta, the page table): cpu_program.py. Attention: cpu_attention.py,
linear and gru_cell: cpu_linear.py.
"""
from __future__ import annotations

import numpy as np
from numba import njit

from ..model.kernel_spec import (
    ACT_SILU,
    META_KV_LEN,
    META_POS,
    META_RNG,
    META_STEP,
    RMS_EPS,
    SCORE_FLOOR,
)
from . import numba_cache  # noqa: F401  before any @njit: the cache keyed by these sources
from .cpu_linear import _act
from .cpu_registry import compiled, program

_F0, _F1 = np.float32(0.0), np.float32(1.0)
_EPS, _FLOOR, _NEG_BIG = np.float32(RMS_EPS), np.float32(SCORE_FLOOR), np.float32(-3e38)
_WRAP = np.int64(1) << np.int64(62)
_MASK32 = np.uint64(0xFFFFFFFF)


@compiled
@njit(cache=True, nogil=True)
def rmsnorm(x, g, y, ms, n):
    acc = _F0
    for i in range(n):
        acc += x[i] * x[i]
    acc = np.sqrt(acc * np.float32(1.0 / n) + _EPS)
    ms[0] = acc
    for i in range(n):
        y[i] = x[i] / acc * g[i]


@compiled
@njit(cache=True, nogil=True)
def causal_conv(x, conv_state, w, bias, out, d, km1):
    """Per channel c: out = silu(x w[km1] + bias + sum_j conv_state[j] w[j], j in order); conv_state shifts in
    x; x += out.
    Loops over channels innermost (each channel's sum in the same order), so the compiler vectorises them."""
    for c in range(d):
        out[c] = x[c] * w[km1 * d + c] + bias[c]
    for j in range(km1):
        for c in range(d):
            out[c] += conv_state[j * d + c] * w[j * d + c]
    for j in range(km1 - 1):
        for c in range(d):
            conv_state[j * d + c] = conv_state[(j + 1) * d + c]
    for c in range(d):
        conv_state[(km1 - 1) * d + c] = x[c]
    for c in range(d):
        acc = _act(out[c], ACT_SILU)
        out[c] = acc
        x[c] += acc


@njit(cache=True, nogil=True)
def _softplus(v):  # as np.logaddexp(0, v) in float32
    if v < _F0:
        return np.log1p(np.exp(v))
    return v + np.log1p(np.exp(-v))


@compiled
@njit(cache=True, nogil=True)
def ssm_step(x, xn, h, proj, a_log, d_skip, d, N):
    for c in range(d):
        dt = _softplus(proj[c])
        u = dt * xn[c]
        y = _F0
        for s in range(N):
            decay = np.exp(-(np.exp(a_log[c * N + s]) * dt))
            hv = h[c * N + s] * decay + u * proj[d + s]
            h[c * N + s] = hv
            if s == 0:
                y = hv * proj[d + N]
            else:
                y += hv * proj[d + N + s]
        x[c] += y + d_skip[c] * xn[c]


@compiled
@njit(cache=True, nogil=True)
def temporal_ensemble(chunk, mtp_state, meta, scale, offset, action, K, A, decay):
    KA = K * A
    step = meta[META_STEP] % _WRAP
    slot = step % K
    for i in range(KA):
        mtp_state[slot * KA + i] = chunk[i]
    for a in range(A):
        action[a] = _F0
    wsum = 0.0
    for age in range(min(step + 1, K)):
        w = np.float32(np.exp(-decay * age))
        base = ((step - age) % K) * KA + age * A
        for a in range(A):
            action[a] += mtp_state[base + a] * w
        wsum += np.float64(w)
    inv = np.float32(1.0 / wsum)
    for a in range(A):
        action[a] = action[a] * inv * scale[a] + offset[a]


@njit(cache=True, nogil=True)
def _mix32(h):
    h ^= h >> np.uint64(16)
    h = (h * np.uint64(0x85EBCA6B)) & _MASK32
    h ^= h >> np.uint64(13)
    h = (h * np.uint64(0xC2B2AE35)) & _MASK32
    h ^= h >> np.uint64(16)
    return h


@njit(cache=True, nogil=True)
def _uniform(seed, counter, index, stream):
    """kernels.rng_uniform for one index."""
    h = (np.uint64(index) * np.uint64(0x9E3779B1)) & _MASK32
    key = np.int64(seed) * np.int64(0x632BE5AB) + counter * np.int64(0x27D4EB2F) + np.int64(stream * 0x165667B1)
    h ^= np.uint64(key) & _MASK32
    h = _mix32(h)
    h ^= np.uint64(counter >> np.int64(32)) & _MASK32
    h = _mix32(h)
    return (np.float32(h >> np.uint64(8)) + np.float32(0.5)) * np.float32(1.0 / (1 << 24))


@compiled
@njit(cache=True, nogil=True)
def rng_noise(action, meta, A, seed, std):
    counter = meta[META_RNG]
    for i in range(A):
        u1 = _uniform(seed, counter, i, 0)
        u2 = _uniform(seed, counter, i, 1)
        z = np.sqrt(np.float32(-2.0) * np.log(u1)) * np.cos(np.float32(2 * np.pi) * u2)
        action[i] += np.float32(std) * z


@compiled
@njit(cache=True, nogil=True)
def meta_advance(meta, kv_window):
    meta[META_STEP] += 1
    meta[META_POS] += 1
    meta[META_KV_LEN] = min(meta[META_KV_LEN] + 1, kv_window)
    meta[META_RNG] += 1


@compiled
@njit(cache=True, nogil=True)
def obs_norm(obs, mean, inv_std, x, n):
    for i in range(n):
        x[i] = (obs[i] - mean[i]) * inv_std[i]


@compiled
@njit(cache=True, nogil=True)
def add(x, y, n):
    for i in range(n):
        x[i] += y[i]


@compiled
@njit(cache=True, nogil=True)
def gru_commit(h, h_new, x, H):
    for i in range(H):
        h[i] = h_new[i]
        x[i] += h_new[i]


# the program of the built-in kernels (cpu_registry.py generates it); tests pick ops by these codes
_BUILT_IN = program()
run_program = _BUILT_IN.run
KERNELS = _BUILT_IN.codes
K_OBS_NORM, K_LINEAR, K_GRU, K_ATTN = (KERNELS[k] for k in ("obs_norm", "linear", "gru_cell", "attn_decode"))
