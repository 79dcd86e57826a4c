"""Attention of the compiled CPU step (cpu_kernels.py): the KV append and single-query attention over the
paged window, chunk j = page slot j by absolute position, combined per row in slot order (DESIGN.md,
"Attention over the paged window"). Rows in lockstep that read one page share key and value loads and do
the same float operations as a row alone, so grouping never changes a byte.

The scores and the value sums run in vector lanes without reordering any sum: a score's lane is a slot (its
channels summed in order), a value sum's lane is a channel (its slots summed in order): the intrinsics of
cpu_simd.py."""
from __future__ import annotations

import numpy as np
from numba import njit

from ..model.kernel_spec import KV_PAGE, META_KV_LEN, META_POS, SCORE_FLOOR
from . import numba_cache  # noqa: F401  before any @njit: the cache keyed by these sources
from .cpu_program import ARG_COLS, _f, _i, _row
from .cpu_registry import compiled
from .cpu_simd import (
    _LANES,
    _scores1,
    _scores2,
    _scores4,
    _values_1x8,
    _values_1x32,
    _values_2x8,
    _values_2x32,
    fma32,
    prefetch,
)

_F0 = np.float32(0.0)
_FLOOR, _NEG_BIG = np.float32(SCORE_FLOOR), np.float32(-3e38)
_WRAP = np.int64(1) << np.int64(62)
_LINE_FLOATS = 16  # a 64-byte cache line
_L2_FLOATS = 1 << 18  # 1 MiB: a core's L2 on the machines this runs on (x86 and Orin)


@njit(cache=True, nogil=True)
def _window(meta, kv_window):
    pos = meta[META_POS] % _WRAP
    count = min(max(meta[META_KV_LEN], 0) + 1, kv_window)
    return pos, pos - count + 1, count


@njit(cache=True, nogil=True)
def _kv_write_row(qkv, log, k_off, v_off, meta, pages, n_pages, P, d):
    pos = meta[META_POS] % _WRAP
    page = pages[(pos // KV_PAGE) % P] % n_pages
    at = (page * KV_PAGE + pos % KV_PAGE) * d
    for c in range(d):
        log[k_off + at + c] = qkv[d + c]
        log[v_off + at + c] = qkv[2 * d + c]


@compiled
@njit(cache=True, nogil=True)
def kv_write(op, sf, si, wf, gf, lf, rows, n_pages, P, d):
    """Every row's k, v at its position in the log (arguments qkv, k_log, v_log, meta, kv_pages)."""
    for b in range(rows):
        _kv_write_row(_f(sf, wf, gf, lf, op, 0, b), lf, op[1 + ARG_COLS * 1 + 1], op[1 + ARG_COLS * 2 + 1],
                      _i(si, op, 3, b), _i(si, op, 4, b), n_pages, P, d)


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
    """q . k summed in index order, a fused multiply-add each (the CPU overlaps the sums of neighbouring slots)."""
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
def _exp_shifted(w, m):
    for t in range(w.size):  # indices from 0, no sum in the loop: so the compiler vectorises it
        w[t] = _exp(max(w[t] - m, _FLOOR))


@njit(cache=True, nogil=True)
def _softmax1(w):
    """One row's chunk scores w -> p = exp(w - m) in place; m = max w and l = sum p, both in slot order."""
    m = _NEG_BIG
    for t in range(w.size):
        m = max(m, w[t])
    _exp_shifted(w, m)
    lsum = _F0
    for t in range(w.size):
        lsum += w[t]
    return m, lsum


@njit(cache=True, nogil=True)
def _softmax2(wa, wb):
    """_softmax1 of two rows, their max and sum chains side by side (the CPU overlaps them)."""
    ma = mb = _NEG_BIG
    for t in range(wa.size):
        ma = max(ma, wa[t])
        mb = max(mb, wb[t])
    _exp_shifted(wa, ma)
    _exp_shifted(wb, mb)
    la = lb = _F0
    for t in range(wa.size):
        la += wa[t]
        lb += wb[t]
    return ma, la, mb, lb


@njit(cache=True, nogil=True)
def _softmax4(wa, wb, wc, wd):
    """_softmax1 of four chains side by side: each max and sum still runs in slot order, four at a time."""
    ma = mb = mc = md = _NEG_BIG
    for t in range(wa.size):
        ma = max(ma, wa[t])
        mb = max(mb, wb[t])
        mc = max(mc, wc[t])
        md = max(md, wd[t])
    _exp_shifted(wa, ma)
    _exp_shifted(wb, mb)
    _exp_shifted(wc, mc)
    _exp_shifted(wd, md)
    la = lb = lc = ld = _F0
    for t in range(wa.size):
        la += wa[t]
        lb += wb[t]
        lc += wc[t]
        ld += wd[t]
    return ma, la, mb, lb, mc, lc, md, ld


@njit(cache=True, nogil=True)
def _chunk(op, wf, si, lf, b0, b1, j, n_pages, P, d, n_heads, hd, kv_window):
    """Chunk j (page slot j) of every head for rows b0..b1-1, which read the same page over the same slots: a
    key load serves up to 4 of them, a value load 2. Per row and head: scores (each summed in channel order),
    m = max, p = exp(s - m) and l = sum p in slot order, acc = sum p v in slot order; the same float
    operations whether a row runs alone or in a group, so grouping never changes a byte. The scores take
    every head of 8 slots before the next 8, so the page's key rows are read in order (at long windows the
    page comes from L3). q, scores, chunk_m/l/acc live in the work slab."""
    R = P * KV_PAGE
    page = _i(si, op, 4, b0)[j] % n_pages
    pos, first, count = _window(_i(si, op, 3, b0), kv_window)
    t0, t1 = _slots_in_window(j, first % R, R, count)
    k_off, v_off = op[1 + ARG_COLS * 1 + 1], op[1 + ARG_COLS * 2 + 1]
    scale = np.float32(1.0 / np.sqrt(hd))
    for h in range(n_heads):
        c = h * P + j
        for b in range(b0, b1):
            acc = _row(op, 9, b) + c * hd
            for e in range(hd):
                wf[acc + e] = _F0
            wf[_row(op, 7, b) + c] = _NEG_BIG  # chunk_m: an empty chunk weighs exp(-3e38 - max) = 0
            wf[_row(op, 8, b) + c] = _F0  # chunk_l
    if t0 >= t1:
        return
    t8 = t0 + (t1 - t0) // _LANES * _LANES
    q_rs, s_rs = op[1 + ARG_COLS * 0 + 2], op[1 + ARG_COLS * 6 + 2]  # row strides
    ahead = P * KV_PAGE * d >= _L2_FLOATS  # a layer's keys do not stay in L2: the pages come from L3 or DRAM
    for t in range(t0, t8, _LANES):  # eight slots' sums side by side, one vector lane each
        row0 = (page * KV_PAGE + t) * d
        for x in range(0, _LANES * d if ahead else 0, _LINE_FLOATS):  # the next 8 key rows, these 8 value rows
            prefetch(lf, k_off + row0 + _LANES * d + x)
            prefetch(lf, v_off + row0 + x)
        for h in range(n_heads):
            q0, c = h * hd, h * P + j
            at = k_off + (page * KV_PAGE + t) * d + q0
            b = b0
            while b < b1:
                q_at, s_at = _row(op, 0, b) + q0, _row(op, 6, b) + c * KV_PAGE + t
                if b1 - b >= 4:
                    _scores4(wf, lf, q_at, q_rs, at, d, hd, s_at, s_rs, scale)
                    b += 4
                elif b1 - b >= 2:
                    _scores2(wf, lf, q_at, q_rs, at, d, hd, s_at, s_rs, scale)
                    b += 2
                else:
                    _scores1(wf, lf, q_at, q_rs, at, d, hd, s_at, s_rs, scale)
                    b += 1
    for h in range(n_heads):
        _last_scores(op, wf, lf, b0, b1, page, t8, t1, k_off, d, hd, h * hd, h * P + j, scale)
    _softmax_chains(op, wf, b0, b1, j, P, n_heads, t0, t1)
    for h in range(n_heads):
        _values(op, wf, lf, b0, b1, page, t0, t1, v_off, d, hd, h * hd, h * P + j)


@njit(cache=True, nogil=True)
def _last_scores(op, wf, lf, b0, b1, page, t8, t1, k_off, d, hd, q0, c, scale):
    """The scores of slots t8..t1-1 (fewer than 8, past the vector blocks): four independent chains, each in
    channel order, then one at a time."""
    t4 = t8 + (t1 - t8) // 4 * 4
    for t in range(t8, t4, 4):
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


@njit(cache=True, nogil=True)
def _softmax_chains(op, wf, b0, b1, j, P, n_heads, t0, t1):
    """Scores -> softmax weights in place, chunk_m and chunk_l, for chunk j of every head of rows b0..b1-1:
    each (row, head) is its own max and sum chain over slots t0..t1-1; four chains run side by side (a
    serial chain waits on its adder's latency, four fill it), each in slot order as alone."""
    n = (b1 - b0) * n_heads
    k = 0
    while k < n:
        g = 4 if n - k >= 4 else 2 if n - k >= 2 else 1
        w0 = _chain(op, wf, b0, k, j, P, n_heads, t0, t1)
        if g == 4:
            m0, l0, m1, l1, m2, l2, m3, l3 = _softmax4(w0, _chain(op, wf, b0, k + 1, j, P, n_heads, t0, t1),
                                                       _chain(op, wf, b0, k + 2, j, P, n_heads, t0, t1),
                                                       _chain(op, wf, b0, k + 3, j, P, n_heads, t0, t1))
            _chain_ml(op, wf, b0, k + 2, j, P, n_heads, m2, l2)
            _chain_ml(op, wf, b0, k + 3, j, P, n_heads, m3, l3)
        elif g == 2:
            m0, l0, m1, l1 = _softmax2(w0, _chain(op, wf, b0, k + 1, j, P, n_heads, t0, t1))
        else:
            m0, l0 = _softmax1(w0)
        _chain_ml(op, wf, b0, k, j, P, n_heads, m0, l0)
        if g >= 2:
            _chain_ml(op, wf, b0, k + 1, j, P, n_heads, m1, l1)
        k += g


@njit(cache=True, nogil=True)
def _chain(op, wf, b0, k, j, P, n_heads, t0, t1):
    """Chain k of chunk j: row b0 + k // n_heads, head k % n_heads; its scores over slots t0..t1-1."""
    at = _row(op, 6, b0 + k // n_heads) + ((k % n_heads) * P + j) * KV_PAGE
    return wf[at + t0:at + t1]


@njit(cache=True, nogil=True)
def _chain_ml(op, wf, b0, k, j, P, n_heads, m, lsum):
    b, c = b0 + k // n_heads, (k % n_heads) * P + j
    wf[_row(op, 7, b) + c] = m
    wf[_row(op, 8, b) + c] = lsum


@njit(cache=True, nogil=True)
def _values(op, wf, lf, b0, b1, page, t0, t1, v_off, d, hd, q0, c):
    """acc += p v over slots t0..t1-1 in order, for chunk c (head channels q0..) of rows b0..b1-1."""
    wide = hd // _LANES * _LANES
    v_at = v_off + (page * KV_PAGE + t0) * d + q0
    n = t1 - t0
    p_rs, a_rs = op[1 + ARG_COLS * 6 + 2], op[1 + ARG_COLS * 9 + 2]
    e = 0
    while e < wide:  # channels 8 to a vector lane (32 at once where they fit), each summed in slot order
        quad = e + 4 * _LANES <= wide
        b = b0
        while b < b1:
            p_at, a_at = _row(op, 6, b) + c * KV_PAGE + t0, _row(op, 9, b) + c * hd + e
            pair = b + 2 <= b1
            if quad and pair:
                _values_2x32(wf, lf, p_at, p_rs, v_at + e, d, n, a_at, a_rs)
            elif quad:
                _values_1x32(wf, lf, p_at, p_rs, v_at + e, d, n, a_at, a_rs)
            elif pair:
                _values_2x8(wf, lf, p_at, p_rs, v_at + e, d, n, a_at, a_rs)
            else:
                _values_1x8(wf, lf, p_at, p_rs, v_at + e, d, n, a_at, a_rs)
            b += 2 if pair else 1
        e += 4 * _LANES if quad else _LANES
    for t in range(t0, t1):  # channels past the last 8
        at = v_off + (page * KV_PAGE + t) * d + q0
        for b in range(b0, b1):
            p = wf[_row(op, 6, b) + c * KV_PAGE + t]
            a0 = _row(op, 9, b) + c * hd
            for e in range(wide, hd):
                wf[a0 + e] = fma32(p, lf[at + e], wf[a0 + e])


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


@compiled
@njit(cache=True, nogil=True)
def attn_decode(op, sf, si, wf, gf, lf, rows, n_pages, P, d, n_heads, kv_window):
    """Attention of every row over its window; chunk j = page slot j (positions t with (t // KV_PAGE) % P == j),
    combined per row in slot order: out = sum_j acc_j w_j / sum_j l_j w_j, w_j = exp(m_j - max m)."""
    hd = d // n_heads
    for j in range(P):
        if _same_chunk(op, si, rows, j, n_pages):
            _chunk(op, wf, si, lf, 0, rows, j, n_pages, P, d, n_heads, hd, kv_window)
        else:
            for b in range(rows):
                _chunk(op, wf, si, lf, b, b + 1, j, n_pages, P, d, n_heads, hd, kv_window)
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
