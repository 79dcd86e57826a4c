"""Sequence forms: the math of an op over all n steps at once, for cold prefill (model/network.py pairs each with
its step form). They run on the backend's array module (NumPy or CuPy); the GRU scan runs as one fused
CUDA kernel where the backend has it.

Tuned, because every speedup is quoted against cold prefill: attention masks only the two edge blocks of
a chunk (never a dense [n, W] mask), its softmax runs in place in one preallocated scores buffer and gets
its row sums from the P @ V GEMM (a column of ones); the NumPy GRU scan preallocates every buffer and
folds b_hh into the GEMV. Each matches its step form within float tolerance (GEMM vs GEMV order).
"""
from __future__ import annotations

import math

import numpy as np

from .kernel_spec import GRU_SCAN_MAX_H, RMS_EPS

QUERY_CHUNK = 256


def silu(xp, v):
    return v / (1.0 + xp.exp(-v))


def rmsnorm(xp, x, g):
    ms = (x * x).mean(axis=1, keepdims=True, dtype=xp.float32)
    return x / xp.sqrt(ms + RMS_EPS) * g


def _heads_major(xp, a, n_heads: int):
    """[n, d] -> contiguous [H, n, hd]."""
    n, d = a.shape
    return xp.ascontiguousarray(a.reshape(n, n_heads, d // n_heads).transpose(1, 0, 2))


def windowed_attention(xp, q, k, v, n_heads: int, window: int, first: int = 0):
    """Causal attention over the last ``window`` keys for the queries first..n-1 (rows of q, k, v:
    positions 0..n-1). Returns [n - first, d]."""
    n, d = k.shape
    H, hd = n_heads, d // n_heads
    f32 = xp.float32
    qh = _heads_major(xp, q[first:] * f32(1.0 / math.sqrt(hd)), H)  # scaled once here, not per score
    kt = xp.ascontiguousarray(k.reshape(n, H, hd).transpose(1, 2, 0))  # [H, hd, n]: K^T, BLAS-ready
    # V with a column of ones: the P @ V GEMM returns each row's softmax denominator as column hd
    va = xp.ones((H, n, hd + 1), f32)
    va[:, :, :hd] = v.reshape(n, H, hd).transpose(1, 0, 2)
    nq = n - first
    C = min(QUERY_CHUNK, nq)
    span = min(n, window + C - 1)  # most keys one chunk can see
    scores = xp.empty(H * C * span, f32)  # one buffer, reshaped per chunk into a contiguous view
    pv = xp.empty((H, C, hd + 1), f32)
    above = xp.triu(xp.ones((C, C), bool), 1)  # j > t inside the diagonal block
    out = xp.empty((H, nq, hd), f32)
    neg_inf = f32(-np.inf)
    for s in range(first, n, C):
        e = min(n, s + C)
        c, lo = e - s, max(0, s - window + 1)
        L = e - lo
        sc = scores[:H * c * L].reshape(H, c, L)
        xp.matmul(qh[:, s - first:e - first], kt[:, :, lo:e], out=sc)
        xp.copyto(sc[:, :, L - c:], neg_inf, where=above[:c, :c])  # the future
        old = e - window - lo  # keys older than the window exist for the chunk's later queries only
        if old > 0:
            t = xp.arange(s, e)[:, None]
            j = xp.arange(lo, lo + old)[None, :]
            xp.copyto(sc[:, :, :old], neg_inf, where=j <= t - window)
        sc -= sc.max(axis=2, keepdims=True)
        xp.exp(sc, out=sc)
        o = pv[:, :c]
        xp.matmul(sc, va[:, lo:e], out=o)
        xp.divide(o[:, :, :hd], o[:, :, hd:], out=out[:, s - first:e - first])
    return out.transpose(1, 0, 2).reshape(nq, d)


def gru_scan(backend, gi, w_hh, b_hh):
    """hs[n, H]: the GRU recurrence over precomputed input gates gi[n, 3H] (b_ih included), h0 = 0; the fused
    kernel (gru_scan_f32: one persistent block) where the backend launches kernels and H fits its block, else
    this loop on the backend's array module."""
    n, H = gi.shape[0], gi.shape[1] // 3
    xp = backend.xp
    if hasattr(backend, "launch") and H <= GRU_SCAN_MAX_H:
        hs = xp.empty((n, H), xp.float32)
        backend.launch("gru_scan", *(xp.ascontiguousarray(a, dtype=xp.float32) for a in (gi, w_hh, b_hh)), hs)
        return hs
    f32 = xp.float32
    # rows [h_{t-1}, 1]: one GEMV per step also adds b_hh. The r, z columns are halved (exact in
    # binary floating point) for sigmoid(a) = (1 + tanh(a / 2)) / 2.
    hs = xp.empty((n + 1, H + 1), f32)
    hs[0, :H] = 0.0
    hs[:, H] = 1.0
    w = xp.empty((H + 1, 3 * H), f32)
    w[:H], w[H] = w_hh, b_hh
    w[:, :2 * H] *= f32(0.5)
    gi_rz = gi[:, :2 * H] * f32(0.5)
    gi_n = xp.ascontiguousarray(gi[:, 2 * H:])
    gh, rz, nn, dh = xp.empty(3 * H, f32), xp.empty(2 * H, f32), xp.empty(H, f32), xp.empty(H, f32)
    r, z, gh_rz, gh_n = rz[:H], rz[H:], gh[:2 * H], gh[2 * H:]
    halves = xp.full(2 * H, 0.5, f32)  # an array operand: in-place ops with a Python scalar cost 2-3x more
    # per-step views made once: [h_{t-1}, 1], h_{t-1}, h_t, the input gates
    steps = zip(hs[:-1], hs[:-1, :H], hs[1:, :H], gi_rz, gi_n)
    for row, h, h_next, g_rz, g_n in steps:
        xp.matmul(row, w, out=gh)
        xp.add(gh_rz, g_rz, out=rz)
        xp.tanh(rz, out=rz)
        xp.multiply(rz, halves, out=rz)
        xp.add(rz, halves, out=rz)
        xp.multiply(r, gh_n, out=nn)
        xp.add(nn, g_n, out=nn)
        xp.tanh(nn, out=nn)
        xp.subtract(h, nn, out=dh)  # h_new = n + z * (h - n)
        xp.multiply(dh, z, out=dh)
        xp.add(nn, dh, out=h_next)
    return hs[1:, :H]
