"""The compiled CPU step: every kernel of kernels.py as a numba function over one row, and ``run_program``,
which runs a whole encoded plan (all ops, all rows of a range) in one nogil call (cpu_backend.py encodes it).

Every reduction runs per row in an order fixed by the code and the config alone: a GEMV sums over its
input index in order (vectorised across outputs, each with its own accumulator), an attention score sums
its head's channels in order, softmax sums run over slots in order, chunks are the page slots
by absolute position and combine in slot order. Nothing depends on the batch size or on which rows share a
page, so a branch of a batch is byte-identical to that row stepped alone. No ``fastmath``: the compiler may
vectorise across independent accumulators but never reassociate a sum. Nothing here allocates.

Buffers arrive as slices of four flat float32 regions (the small slab, the work slab, the weights, the KV
log) and one int64 view of the small slab (meta, the page table).
"""
from __future__ import annotations

import numpy as np
from numba import njit

from .kernel_spec import (
    ACT_RELU,
    ACT_SILU,
    ACT_TANH,
    ENSEMBLE_DECAY,
    KV_PAGE,
    META_KV_LEN,
    META_POS,
    META_RNG,
    META_STEP,
    RMS_EPS,
    SCORE_FLOOR,
)

# kernel codes of an encoded program (cpu_backend.KERNEL_CODES maps names to these)
K_OBS_NORM, K_LINEAR, K_ADD, K_RMSNORM, K_CONV, K_GRU, K_GRU_COMMIT, K_SSM, K_KV_WRITE, K_ATTN, K_ENSEMBLE, \
    K_NOISE, K_META = range(13)
KERNELS = {"obs_norm": K_OBS_NORM, "linear": K_LINEAR, "add": K_ADD, "rmsnorm": K_RMSNORM, "causal_conv": K_CONV,
           "gru_cell": K_GRU, "gru_commit": K_GRU_COMMIT, "ssm_step": K_SSM, "kv_write": K_KV_WRITE,
           "attn_decode": K_ATTN, "temporal_ensemble": K_ENSEMBLE, "rng_noise": K_NOISE, "meta_advance": K_META}
T_BLOCK = 16  # key slots transposed at once for the attention scores (one 512-bit vector)
ARG_COLS = 4  # per argument: region, element offset of the first row, row stride, elements per row
MAX_ARGS = 15
DIM0 = 1 + ARG_COLS * MAX_ARGS  # first column of the op's integer dimensions
N_DIMS = 6
REG_STATE, REG_STATE_I64, REG_WORK, REG_WEIGHT, REG_LOG = range(5)

_F0, _F1 = np.float32(0.0), np.float32(1.0)
_EPS, _FLOOR, _NEG_BIG = np.float32(RMS_EPS), np.float32(SCORE_FLOOR), np.float32(-3e38)
_WRAP = np.int64(1) << np.int64(62)
_MASK32 = np.uint64(0xFFFFFFFF)


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
            y[j] += xi * wi[j]


@njit(cache=True, nogil=True)
def linear(x, w, bias, y, n_in, n_out, act):
    gemv(x, w, y, n_in, n_out)
    for j in range(n_out):
        y[j] = _act(y[j] + bias[j], act)


@njit(cache=True, nogil=True)
def rmsnorm(x, g, y, ms_out, n):
    ms = _F0
    for i in range(n):
        ms += x[i] * x[i]
    ms = np.sqrt(ms * np.float32(1.0 / n) + _EPS)
    ms_out[0] = ms
    for i in range(n):
        y[i] = x[i] / ms * g[i]


@njit(cache=True, nogil=True)
def causal_conv(x, cs, w, bias, out, d, km1):
    for c in range(d):
        acc = x[c] * w[km1 * d + c] + bias[c]
        for j in range(km1):
            acc += cs[j * d + c] * w[j * d + c]
        for j in range(km1 - 1):
            cs[j * d + c] = cs[(j + 1) * d + c]
        cs[(km1 - 1) * d + c] = x[c]
        acc = _act(acc, ACT_SILU)
        out[c] = acc
        x[c] += acc


@njit(cache=True, nogil=True)
def gru_cell(x, h, w_ih, w_hh, b_ih, b_hh, gi, gh, h_new, n_in, H):
    linear(x, w_ih, b_ih, gi, n_in, 3 * H, 0)
    linear(h, w_hh, b_hh, gh, H, 3 * H, 0)
    for c in range(H):
        r = _F1 / (_F1 + np.exp(-(gi[c] + gh[c])))
        z = _F1 / (_F1 + np.exp(-(gi[H + c] + gh[H + c])))
        n = np.tanh(gi[2 * H + c] + gh[2 * H + c] * r)
        h_new[c] = (h[c] - n) * z + n


@njit(cache=True, nogil=True)
def _softplus(v):  # as np.logaddexp(0, v) in float32
    if v < _F0:
        return np.log1p(np.exp(v))
    return v + np.log1p(np.exp(-v))


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


@njit(cache=True, nogil=True)
def _window(meta, kv_window):
    pos = meta[META_POS] % _WRAP
    count = min(max(meta[META_KV_LEN], 0) + 1, kv_window)
    return pos, pos - count + 1, count


@njit(cache=True, nogil=True)
def kv_write(qkv, log, k_off, v_off, meta, pages, n_pages, P, d):
    pos = meta[META_POS] % _WRAP
    page = pages[(pos // KV_PAGE) % P] % n_pages
    at = (page * KV_PAGE + pos % KV_PAGE) * d
    for c in range(d):
        log[k_off + at + c] = qkv[d + c]
        log[v_off + at + c] = qkv[2 * d + c]


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
        s += q[e] * k[e]
    return s


@njit(cache=True, nogil=True)
def _dot4(q, k0, k1, k2, k3, n):
    """Four _dot(q, k_i) at once: the same sums, interleaved for the CPU's parallel adders."""
    s0 = s1 = s2 = s3 = _F0
    for e in range(n):
        qe = q[e]
        s0 += qe * k0[e]
        s1 += qe * k1[e]
        s2 += qe * k2[e]
        s3 += qe * k3[e]
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
def _row(op, a, b):
    """Element offset of argument a at row b (in its region)."""
    return op[1 + ARG_COLS * a + 1] + b * op[1 + ARG_COLS * a + 2]


@njit(cache=True, nogil=True)
def _chunk(op, wf, si, lf, kt, b0, b1, h, j, n_pages, P, d, hd, kv_window):
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
                acc[e] += p * v[e]


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
def attn_decode(op, sf, si, wf, gf, lf, kt, rows, n_pages, P, d, n_heads, kv_window):
    """Attention of every row over its window; chunk j = page slot j (positions t with (t // KV_PAGE) % P == j),
    combined per row in slot order: out = sum_j acc_j w_j / sum_j l_j w_j, w_j = exp(m_j - max m)."""
    hd = d // n_heads
    for j in range(P):
        if _same_chunk(op, si, rows, j, n_pages):
            for h in range(n_heads):
                _chunk(op, wf, si, lf, kt, 0, rows, h, j, n_pages, P, d, hd, kv_window)
        else:
            for b in range(rows):
                for h in range(n_heads):
                    _chunk(op, wf, si, lf, kt, b, b + 1, h, j, n_pages, P, d, hd, kv_window)
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


@njit(cache=True, nogil=True)
def temporal_ensemble(chunk, mtp, meta, action, K, A):
    KA = K * A
    step = meta[META_STEP] % _WRAP
    slot = step % K
    for i in range(KA):
        mtp[slot * KA + i] = chunk[i]
    for a in range(A):
        action[a] = _F0
    wsum = 0.0
    for age in range(min(step + 1, K)):
        w = np.float32(np.exp(-ENSEMBLE_DECAY * age))
        base = ((step - age) % K) * KA + age * A
        for a in range(A):
            action[a] += mtp[base + a] * w
        wsum += np.float64(w)
    inv = np.float32(1.0 / wsum)
    for a in range(A):
        action[a] *= inv


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


@njit(cache=True, nogil=True)
def rng_noise(action, meta, A, seed, std):
    counter = meta[META_RNG]
    for i in range(A):
        u1 = _uniform(seed, counter, i, 0)
        u2 = _uniform(seed, counter, i, 1)
        z = np.sqrt(np.float32(-2.0) * np.log(u1)) * np.cos(np.float32(2 * np.pi) * u2)
        action[i] += np.float32(std) * z


@njit(cache=True, nogil=True)
def meta_advance(meta, kv_window):
    meta[META_STEP] += 1
    meta[META_POS] += 1
    meta[META_KV_LEN] = min(meta[META_KV_LEN] + 1, kv_window)
    meta[META_RNG] += 1


@njit(cache=True, nogil=True)
def _f(sf, wf, gf, lf, op, a, row):
    """Argument a of op, row `row` of the range: a float32 slice of its region."""
    c = 1 + ARG_COLS * a
    reg, off, n = op[c], op[c + 1] + row * op[c + 2], op[c + 3]
    if reg == REG_STATE:
        return sf[off:off + n]
    if reg == REG_WORK:
        return wf[off:off + n]
    if reg == REG_WEIGHT:
        return gf[off:off + n]
    return lf[off:off + n]


@njit(cache=True, nogil=True)
def _i(si, op, a, row):
    c = 1 + ARG_COLS * a
    off = op[c + 1] + row * op[c + 2]
    return si[off:off + op[c + 3]]


@njit(cache=True, nogil=True)
def run_program(prog, fconst, sf, si, wf, gf, lf, kt, rows):
    """The whole step: every op of prog in order, each over rows 0..rows-1 of its range. kt: T_BLOCK * d floats
    of scratch for transposed keys."""
    for o in range(prog.shape[0]):
        op = prog[o]
        k = op[0]
        dims = op[DIM0:DIM0 + N_DIMS]
        if k == K_ATTN:  # all rows at once: rows reading the same page share each load
            attn_decode(op, sf, si, wf, gf, lf, kt, rows, dims[0], dims[1], dims[2], dims[3], dims[4])
            continue
        for b in range(rows):
            if k == K_LINEAR:
                linear(_f(sf, wf, gf, lf, op, 0, b), _f(sf, wf, gf, lf, op, 1, b), _f(sf, wf, gf, lf, op, 2, b),
                       _f(sf, wf, gf, lf, op, 3, b), dims[0], dims[1], dims[2])
            elif k == K_RMSNORM:
                rmsnorm(_f(sf, wf, gf, lf, op, 0, b), _f(sf, wf, gf, lf, op, 1, b), _f(sf, wf, gf, lf, op, 2, b),
                        _f(sf, wf, gf, lf, op, 3, b), dims[0])
            elif k == K_ADD:
                x, y = _f(sf, wf, gf, lf, op, 0, b), _f(sf, wf, gf, lf, op, 1, b)
                for i in range(dims[0]):
                    x[i] += y[i]
            elif k == K_KV_WRITE:
                kv_write(_f(sf, wf, gf, lf, op, 0, b), lf, op[1 + ARG_COLS * 1 + 1], op[1 + ARG_COLS * 2 + 1],
                         _i(si, op, 3, b), _i(si, op, 4, b), dims[0], dims[1], dims[2])
            elif k == K_CONV:
                causal_conv(_f(sf, wf, gf, lf, op, 0, b), _f(sf, wf, gf, lf, op, 1, b), _f(sf, wf, gf, lf, op, 2, b),
                            _f(sf, wf, gf, lf, op, 3, b), _f(sf, wf, gf, lf, op, 4, b), dims[0], dims[1])
            elif k == K_GRU:
                gru_cell(_f(sf, wf, gf, lf, op, 0, b), _f(sf, wf, gf, lf, op, 1, b), _f(sf, wf, gf, lf, op, 2, b),
                         _f(sf, wf, gf, lf, op, 3, b), _f(sf, wf, gf, lf, op, 4, b), _f(sf, wf, gf, lf, op, 5, b),
                         _f(sf, wf, gf, lf, op, 6, b), _f(sf, wf, gf, lf, op, 7, b), _f(sf, wf, gf, lf, op, 8, b),
                         dims[0], dims[1])
            elif k == K_GRU_COMMIT:
                h, hn, x = _f(sf, wf, gf, lf, op, 0, b), _f(sf, wf, gf, lf, op, 1, b), _f(sf, wf, gf, lf, op, 2, b)
                for i in range(dims[0]):
                    h[i] = hn[i]
                    x[i] += hn[i]
            elif k == K_SSM:
                ssm_step(_f(sf, wf, gf, lf, op, 0, b), _f(sf, wf, gf, lf, op, 1, b), _f(sf, wf, gf, lf, op, 2, b),
                         _f(sf, wf, gf, lf, op, 3, b), _f(sf, wf, gf, lf, op, 4, b), _f(sf, wf, gf, lf, op, 5, b),
                         dims[0], dims[1])
            elif k == K_OBS_NORM:
                obs, mean, inv, x = (_f(sf, wf, gf, lf, op, 0, b), _f(sf, wf, gf, lf, op, 1, b),
                                     _f(sf, wf, gf, lf, op, 2, b), _f(sf, wf, gf, lf, op, 3, b))
                for i in range(dims[0]):
                    x[i] = (obs[i] - mean[i]) * inv[i]
            elif k == K_ENSEMBLE:
                temporal_ensemble(_f(sf, wf, gf, lf, op, 0, b), _f(sf, wf, gf, lf, op, 1, b), _i(si, op, 2, b),
                                  _f(sf, wf, gf, lf, op, 3, b), dims[0], dims[1])
            elif k == K_NOISE:
                rng_noise(_f(sf, wf, gf, lf, op, 0, b), _i(si, op, 1, b), dims[0], dims[1], fconst[o])
            elif k == K_META:
                meta_advance(_i(si, op, 0, b), dims[0])
