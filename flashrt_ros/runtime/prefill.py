"""cold_prefill: the fastest honest recompute of the live state from the observation history.

Layer by layer over all n steps at once: GEMMs for every projection, a vectorised causal conv,
a sequential GRU scan (only h @ W_hh is sequential), windowed causal attention in query chunks.
Works on the backend's array module (NumPy or CuPy). It reproduces the step plan's math, so the
state it writes matches stepping within float tolerance (GEMM vs GEMV order); meta is exact.

Tuned, because every speedup is quoted against it: attention masks only the two edge blocks of a
chunk (never a dense [n, W] mask), its softmax runs in place in one preallocated scores buffer and
gets its row sums from the P @ V GEMM (a column of ones); the NumPy GRU scan preallocates every
buffer and folds b_hh into the GEMV; the last layer computes attention and MLP only for the rows
the action head reads (nothing else of that layer's output reaches the state).
"""
from __future__ import annotations

import math

import numpy as np

from .kernel_spec import GRU_SCAN_MAX_H
from .kernels import META_KV_LEN, META_POS, META_RNG, META_STEP, RMS_EPS

QUERY_CHUNK = 256


def _silu(xp, v):
    return v / (1.0 + xp.exp(-v))


def _rmsnorm(xp, x, g):
    ms = (x * x).mean(axis=1, keepdims=True, dtype=xp.float32)
    return x / xp.sqrt(ms + RMS_EPS) * g


def _heads_major(xp, a, n_heads: int):
    """[n, d] -> contiguous [H, n, hd]."""
    n, d = a.shape
    return xp.ascontiguousarray(a.reshape(n, n_heads, d // n_heads).transpose(1, 0, 2))


def _attention(xp, q, k, v, n_heads: int, window: int, first: int = 0):
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
    """hs[n, H]: the GRU recurrence over precomputed input gates; a fused kernel where the backend has one
    (and H fits its block), else this loop on the backend's array module."""
    n, H = gi.shape[0], gi.shape[1] // 3
    if hasattr(backend, "gru_scan") and H <= GRU_SCAN_MAX_H:
        return backend.gru_scan(gi, w_hh, b_hh)
    xp = backend.xp
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


def prefill(session, obs: np.ndarray) -> None:
    """Write the state after the observations obs[n, obs_dim] into the live row."""
    with np.errstate(over="ignore"), session.backend.activate():
        _prefill(session, obs)


def _prefill(session, obs: np.ndarray) -> None:
    cfg, arena, xp = session.cfg, session.arena, session.backend.xp
    n = len(obs)
    d, W, K, km1 = cfg.d_model, cfg.kv_window, cfg.chunk_len, cfg.conv_kernel - 1

    def w(name):
        return arena[name]

    def live(name):
        return arena[name][0]

    session.arena.state[0] = 0
    session.kv.clear_row(0)
    if n == 0:
        return
    windows = []  # per layer (k, v) as [W, d], slot = position % W: the layout KvLog.load takes
    head_rows = max(0, n - K)  # the action head reads x at these positions and later only
    o = xp.asarray(obs, dtype=xp.float32)
    x = ((o - w("obs_mean")) * w("obs_inv_std")) @ w("in_proj.w") + w("in_proj.b")  # [n, d]
    for layer in range(cfg.n_layers):
        p = f"layers.{layer}."
        # causal depthwise conv; the state keeps the last k-1 inputs
        padded = xp.concatenate([xp.zeros((km1, d), xp.float32), x])  # [n+k-1, d]
        cw = w(p + "conv.w")
        conv = padded[km1:] * cw[km1] + w(p + "conv.b")
        for j in range(km1):
            conv += padded[j:j + n] * cw[j]
        live(f"conv_state.{layer}")[...] = padded[n:n + km1]
        x = x + _silu(xp, conv)
        # GRU: input projections batched, the recurrence sequential
        gi = x @ w(p + "gru.w_ih") + w(p + "gru.b_ih")  # [n, 3d]
        hs = gru_scan(session.backend, gi, w(p + "gru.w_hh"), w(p + "gru.b_hh"))  # [n, d]
        live(f"recurrent_state.{layer}")[...] = hs[-1]
        x = x + hs
        # windowed causal attention; after the last layer only the head's rows matter
        first = head_rows if layer == cfg.n_layers - 1 else 0
        qkv = _rmsnorm(xp, x, w(p + "attn_norm.g")) @ w(p + "qkv.w") + w(p + "qkv.b")  # [n, 3d]
        q, k, v = qkv[:, :d], qkv[:, d:2 * d], qkv[:, 2 * d:]
        kv_first = max(0, n - W)
        slots = np.arange(kv_first, n) % W
        kw, vw = np.zeros((W, d), np.float32), np.zeros((W, d), np.float32)
        kw[slots], vw[slots] = session.backend.to_host(k[kv_first:]), session.backend.to_host(v[kv_first:])
        windows.append((kw, vw))
        x = x[first:] + _attention(xp, q, k, v, cfg.n_heads, W, first) @ w(p + "out.w") + w(p + "out.b")
        # MLP
        hmid = _silu(xp, _rmsnorm(xp, x, w(p + "mlp_norm.g")) @ w(p + "mlp.w1") + w(p + "mlp.b1"))
        x = x + hmid @ w(p + "mlp.w2") + w(p + "mlp.b2")
    chunks = xp.tanh(_rmsnorm(xp, x, w("head_norm.g")) @ w("head.w") + w("head.b"))  # [<=K, K*A]
    live("mtp_state")[xp.arange(head_rows, n) % K] = chunks
    meta = np.zeros(arena["meta"].shape[1], np.int64)
    meta[META_STEP] = meta[META_POS] = meta[META_RNG] = n
    meta[META_KV_LEN] = min(n, W)
    session.backend.from_host(live("meta"), meta)
    pages = session.kv.load(windows, n, min(n, W))  # the row takes over the load's references
    session.kv.set_row(0, pages)
    session.kv.decref(pages)
