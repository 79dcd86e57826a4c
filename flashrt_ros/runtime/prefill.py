"""cold_prefill: the fastest honest recompute of the live state from the observation history.

Layer by layer over all n steps at once: GEMMs for every projection, a vectorised causal conv,
a sequential GRU scan (only h @ W_hh is sequential), windowed causal attention in query chunks.
Works on the backend's array module (NumPy or CuPy). It reproduces the step plan's math, so the
state it writes matches stepping within float tolerance (GEMM vs GEMV order); meta is exact.
"""
from __future__ import annotations

import math

import numpy as np

from .kernels import META_KV_LEN, META_POS, META_RNG, META_STEP, RMS_EPS

QUERY_CHUNK = 256


def _silu(xp, v):
    return v / (1.0 + xp.exp(-v))


def _rmsnorm(xp, x, g):
    ms = (x * x).mean(axis=1, keepdims=True, dtype=xp.float32)
    return x / xp.sqrt(ms + RMS_EPS) * g


def _attention(xp, q, k, v, n_heads: int, window: int):
    """Causal attention over the last ``window`` keys for every query. q, k, v: [n, d]."""
    n, d = q.shape
    hd = d // n_heads
    qh = q.reshape(n, n_heads, hd).transpose(1, 0, 2)  # [H, n, hd]
    kh = k.reshape(n, n_heads, hd).transpose(1, 0, 2)
    vh = v.reshape(n, n_heads, hd).transpose(1, 0, 2)
    out = xp.empty((n_heads, n, hd), xp.float32)
    scale = xp.float32(1.0 / math.sqrt(hd))
    for s in range(0, n, QUERY_CHUNK):
        e = min(n, s + QUERY_CHUNK)
        lo = max(0, s - window + 1)
        sc = xp.matmul(qh[:, s:e], kh[:, lo:e].transpose(0, 2, 1)) * scale  # [H, C, L]
        t = xp.arange(s, e)[:, None]
        j = xp.arange(lo, e)[None, :]
        masked = (j > t) | (j <= t - window)
        sc = xp.where(masked[None], xp.float32(-xp.inf), sc)
        sc -= sc.max(axis=2, keepdims=True)
        p = xp.exp(sc)
        p /= p.sum(axis=2, keepdims=True)
        out[:, s:e] = xp.matmul(p, vh[:, lo:e])
    return out.transpose(1, 0, 2).reshape(n, d)


def gru_scan(backend, gi, w_hh, b_hh):
    """hs[n, H]: the GRU recurrence over precomputed input gates; a fused kernel where the backend has one."""
    if hasattr(backend, "gru_scan"):
        return backend.gru_scan(gi, w_hh, b_hh)
    xp = backend.xp
    n, H = gi.shape[0], gi.shape[1] // 3
    h = xp.zeros((H,), xp.float32)
    hs = xp.empty((n, H), xp.float32)
    for t in range(n):
        gh = h @ w_hh + b_hh
        g = gi[t]
        rz = 1.0 / (1.0 + xp.exp(-(g[:2 * H] + gh[:2 * H])))
        nn = xp.tanh(g[2 * H:] + rz[:H] * gh[2 * H:])
        h = nn + rz[H:] * (h - nn)
        hs[t] = h
    return hs


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
        # windowed causal attention
        qkv = _rmsnorm(xp, x, w(p + "attn_norm.g")) @ w(p + "qkv.w") + w(p + "qkv.b")  # [n, 3d]
        q, k, v = qkv[:, :d], qkv[:, d:2 * d], qkv[:, 2 * d:]
        first = max(0, n - W)
        slots = np.arange(first, n) % W
        kw, vw = np.zeros((W, d), np.float32), np.zeros((W, d), np.float32)
        kw[slots], vw[slots] = session.backend.to_host(k[first:]), session.backend.to_host(v[first:])
        windows.append((kw, vw))
        x = x + _attention(xp, q, k, v, cfg.n_heads, W) @ w(p + "out.w") + w(p + "out.b")
        # MLP
        hmid = _silu(xp, _rmsnorm(xp, x, w(p + "mlp_norm.g")) @ w(p + "mlp.w1") + w(p + "mlp.b1"))
        x = x + hmid @ w(p + "mlp.w2") + w(p + "mlp.b2")
    last = slice(max(0, n - K), n)
    chunks = xp.tanh(_rmsnorm(xp, x[last], w("head_norm.g")) @ w("head.w") + w("head.b"))  # [<=K, K*A]
    live("mtp_state")[xp.arange(max(0, n - K), n) % K] = chunks
    meta = np.zeros(arena["meta"].shape[1], np.int64)
    meta[META_STEP] = meta[META_POS] = meta[META_RNG] = n
    meta[META_KV_LEN] = min(n, W)
    session.backend.from_host(live("meta"), meta)
    pages = session.kv.load(windows, n, min(n, W))  # the row takes over the load's references
    session.kv.set_row(0, pages)
    session.kv.decref(pages)
