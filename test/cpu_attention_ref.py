"""The compiled CPU attention as it was before its batched restructure (flashrt_ros/runtime/engine/cpu_attention.py
at commit 5b3c711), kept verbatim as the byte oracle of test_cpu_attention_bytes.py: one row's
scores are scalar dot products in channel order, four slots interleaved; rows in lockstep share the loads.
Do not edit: the test's point is that the live kernel still computes these exact bytes. One deliberate edit
since: every product summed into a score or a value sum is a fused multiply-add (fma32), as in the live kernel."""
from __future__ import annotations

import numpy as np
from numba import njit

from flashrt_ros.runtime.engine.cpu_program import ARG_COLS, _f, _i, _row
from flashrt_ros.runtime.engine.cpu_simd import fma32
from flashrt_ros.runtime.model.kernel_spec import KV_PAGE, META_KV_LEN, META_POS, SCORE_FLOOR

_F0 = np.float32(0.0)
_FLOOR, _NEG_BIG = np.float32(SCORE_FLOOR), np.float32(-3e38)
_WRAP = np.int64(1) << np.int64(62)


@njit(cache=True, nogil=True)
def _window(meta, kv_window):
    pos = meta[META_POS] % _WRAP
    count = min(max(meta[META_KV_LEN], 0) + 1, kv_window)
    return pos, pos - count + 1, count


_LOG2E, _LN2_HI, _LN2_LO = np.float32(1.4426950408889634), np.float32(0.693359375), np.float32(-2.12194440e-4)
_EXP_C = tuple(np.float32(1.0 / f) for f in (1, 1, 2, 6, 24, 120, 720))


@njit(cache=True, nogil=True)
def _exp(x):
    """exp(x) for x in [SCORE_FLOOR, 0] within 2 ulp, branch-free so the compiler vectorises it (the softmax
    weights; libm's expf is one scalar call per slot): 2^n by the exponent bits times a degree-6 polynomial."""
    n = np.floor(x * _LOG2E + np.float32(0.5))
    r = (x - n * _LN2_HI) - n * _LN2_LO
    c = _EXP_C
    p = c[0] + r * (c[1] + r * (c[2] + r * (c[3] + r * (c[4] + r * (c[5] + r * c[6])))))
    return p * np.int32((np.int32(n) + np.int32(127)) << np.int32(23)).view(np.float32)


@njit(cache=True, nogil=True)
def _dot(q, k, n):
    """q . k summed in index order (the CPU overlaps the independent sums of neighbouring slots)."""
    s = _F0
    for e in range(n):
        s = fma32(q[e], k[e], s)
    return s


@njit(cache=True, nogil=True)
def _dot4(q, k0, k1, k2, k3, n):
    """Four _dot(q, k_i) at once: the same sums, interleaved for the CPU's parallel adders."""
    s0 = s1 = s2 = s3 = _F0
    for e in range(n):
        qe = q[e]
        s0 = fma32(qe, k0[e], s0)
        s1 = fma32(qe, k1[e], s1)
        s2 = fma32(qe, k2[e], s2)
        s3 = fma32(qe, k3[e], s3)
    return s0, s1, s2, s3


@njit(cache=True, nogil=True)
def _slots_in_window(j, lo, R, count):
    """[t0, t1): the slots of page slot j inside the window. Slot t is ring index j * KV_PAGE + t, inside when
    (index - lo) mod R < count; R - count >= KV_PAGE, so that is one contiguous run of slots."""
    ring0 = (j * KV_PAGE - lo) % R  # window offset of slot 0
    if ring0 < count:
        return 0, min(KV_PAGE, count - ring0)
    t0 = R - ring0  # the first slot that wraps to window offset 0
    if t0 < KV_PAGE:
        return t0, min(KV_PAGE, t0 + count)
    return 0, 0


@njit(cache=True, nogil=True)
def _chunk(op, wf, si, lf, b0, b1, h, j, n_pages, P, d, hd, kv_window):
    """Chunk j (page slot j) of head h for rows b0..b1-1, which read the same page over the same slots: each
    key and value row is loaded once for all of them. Per row: scores in slot order, m = max, p = exp(s - m)
    and l = sum p in slot order, acc = sum p v in slot order; the same float operations whether a row runs
    alone or in a group, so grouping never changes a byte. q, scores, chunk_m/l/acc live in the work slab."""
    R = P * KV_PAGE
    page = _i(si, op, 4, b0)[j] % n_pages
    pos, first, count = _window(_i(si, op, 3, b0), kv_window)
    t0, t1 = _slots_in_window(j, first % R, R, count)
    k_off, v_off = op[1 + ARG_COLS * 1 + 1], op[1 + ARG_COLS * 2 + 1]
    q0, c = h * hd, h * P + j
    scale = np.float32(1.0 / np.sqrt(hd))
    for b in range(b0, b1):
        acc = _row(op, 9, b) + c * hd
        for e in range(hd):
            wf[acc + e] = _F0
        wf[_row(op, 7, b) + c] = _NEG_BIG  # chunk_m: an empty chunk weighs exp(-3e38 - max) = 0
        wf[_row(op, 8, b) + c] = _F0  # chunk_l
    if t0 >= t1:
        return
    t4 = t0 + (t1 - t0) // 4 * 4
    for t in range(t0, t4, 4):  # four slots' sums side by side: four independent chains, each in channel order
        at = k_off + (page * KV_PAGE + t) * d + q0
        for b in range(b0, b1):
            q = wf[_row(op, 0, b) + q0:_row(op, 0, b) + q0 + hd]
            s0, s1, s2, s3 = _dot4(q, lf[at:at + hd], lf[at + d:at + d + hd], lf[at + 2 * d:at + 2 * d + hd],
                                   lf[at + 3 * d:at + 3 * d + hd], hd)
            sc = _row(op, 6, b) + c * KV_PAGE + t
            wf[sc] = s0 * scale
            wf[sc + 1] = s1 * scale
            wf[sc + 2] = s2 * scale
            wf[sc + 3] = s3 * scale
    for t in range(t4, t1):
        at = k_off + (page * KV_PAGE + t) * d + q0
        k = lf[at:at + hd]
        for b in range(b0, b1):
            q = _row(op, 0, b) + q0
            wf[_row(op, 6, b) + c * KV_PAGE + t] = _dot(wf[q:q + hd], k, hd) * scale
    for b in range(b0, b1):
        sc = wf[_row(op, 6, b) + c * KV_PAGE:_row(op, 6, b) + (c + 1) * KV_PAGE]
        m = _NEG_BIG
        for t in range(t0, t1):
            m = max(m, sc[t])
        lsum = _F0
        for t in range(t0, t1):
            p = _exp(max(sc[t] - m, _FLOOR))
            sc[t] = p
            lsum += p
        wf[_row(op, 7, b) + c] = m
        wf[_row(op, 8, b) + c] = lsum
    for t in range(t0, t1):
        at = v_off + (page * KV_PAGE + t) * d + q0
        v = lf[at:at + hd]  # slices: the compiler then vectorises across channels
        for b in range(b0, b1):
            p = wf[_row(op, 6, b) + c * KV_PAGE + t]
            a0 = _row(op, 9, b) + c * hd
            acc = wf[a0:a0 + hd]
            for e in range(hd):
                acc[e] = fma32(p, v[e], acc[e])


@njit(cache=True, nogil=True)
def _same_chunk(op, si, rows, j, n_pages):
    """Every row reads the same page at slot j over the same window (branches in lockstep share most)."""
    page, meta = _i(si, op, 4, 0)[j] % n_pages, _i(si, op, 3, 0)
    for b in range(1, rows):
        other = _i(si, op, 3, b)
        if (_i(si, op, 4, b)[j] % n_pages != page or other[META_POS] != meta[META_POS]
                or other[META_KV_LEN] != meta[META_KV_LEN]):
            return False
    return True


@njit(cache=True, nogil=True)
def attn_decode_ref(op, sf, si, wf, gf, lf, rows, n_pages, P, d, n_heads, kv_window):
    """Attention of every row over its window; chunk j = page slot j (positions t with (t // KV_PAGE) % P == j),
    combined per row in slot order: out = sum_j acc_j w_j / sum_j l_j w_j, w_j = exp(m_j - max m)."""
    hd = d // n_heads
    for j in range(P):
        if _same_chunk(op, si, rows, j, n_pages):
            for h in range(n_heads):
                _chunk(op, wf, si, lf, 0, rows, h, j, n_pages, P, d, hd, kv_window)
        else:
            for b in range(rows):
                for h in range(n_heads):
                    _chunk(op, wf, si, lf, b, b + 1, h, j, n_pages, P, d, hd, kv_window)
    for b in range(rows):
        out, cm, cl = _f(sf, wf, gf, lf, op, 5, b), _f(sf, wf, gf, lf, op, 7, b), _f(sf, wf, gf, lf, op, 8, b)
        cacc = _f(sf, wf, gf, lf, op, 9, b)
        for h in range(n_heads):
            m_all = _NEG_BIG
            for j in range(P):
                m_all = max(m_all, cm[h * P + j])
            den = _F0
            for j in range(P):
                wj = np.exp(cm[h * P + j] - m_all)
                cm[h * P + j] = wj
                den += wj * cl[h * P + j]
            o = out[h * hd:(h + 1) * hd]
            for e in range(hd):
                o[e] = _F0
            for j in range(P):
                wj = cm[h * P + j] / den
                acc = cacc[(h * P + j) * hd:(h * P + j + 1) * hd]
                for e in range(hd):
                    o[e] += wj * acc[e]
