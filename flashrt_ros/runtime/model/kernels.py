"""Kernel registry: every op of a plan names a kernel here.

Each kernel has a NumPy reference twin (``*_ref``) that the numpy backend runs and the CUDA C
kernel in ``kernels/*.cu`` is tested against; its compiled CPU form registers under the same name in
engine/cpu_registry.py. Twins write only through ``out=`` / in-place ops
into preallocated buffers, so a replay allocates no arrays.

Batch invariance: every reduction runs per row in a fixed order whatever the batch size. Dot
products go through a broadcast ``(B,1,n) @ (n,m)`` matmul, which is one GEMV per row and
bit-identical to stepping that row alone; ``x.sum(axis)`` is avoided because NumPy may reorder
it with the shape.

Step-dependent values (position, kv_len, step, rng counter) are read from the ``meta`` state
buffer, never passed as arguments. The NumPy twins read row 0's meta: branches of a batch step in
lockstep from one capsule, so every row's meta is equal (the CUDA kernels read each row's own).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from .kernel_spec import (  # noqa: F401 - re-exported: the constants shared with kernels/*.cu
    ACT_NONE,
    ACT_RELU,
    ACT_SILU,
    ACT_TANH,
    KV_PAGE,
    META_KV_LEN,
    META_LEN,
    META_POS,
    META_RNG,
    META_STEP,
    RMS_EPS,
    SCORE_FLOOR,
    SPECS,
    KernelSpec,
)


def window_pages(kv_window: int) -> int:
    """Page-table slots of one row: the pages any window of kv_window positions can touch."""
    return -(-kv_window // KV_PAGE) + 1


@dataclass(frozen=True)
class Kernel:
    """A plan op's kernel: its spec (kernel_spec.py) and its NumPy twin."""
    name: str
    ref: Callable
    spec: KernelSpec

    @property
    def params(self) -> tuple[str, ...]:  # buffer parameters, in order
        return self.spec.params

    @property
    def writes(self) -> tuple[str, ...]:  # the subset of params the kernel writes
        return self.spec.writes

    @property
    def consts(self) -> tuple[str, ...]:  # integer/float constants, fixed at capture
        return tuple(c for c, _ in self.spec.consts)

    @property
    def inplace(self) -> tuple[str, ...]:  # written params that are also read
        return self.spec.inplace

    @property
    def reads(self) -> tuple[str, ...]:
        return tuple(p for p in self.params if p not in self.writes or p in self.inplace)


REGISTRY: dict[str, Kernel] = {}


def kernel(fn):
    """Register fn (``<name>_ref``) as the NumPy twin of the kernel spec ``<name>``."""
    name = fn.__name__.removesuffix("_ref")
    spec = SPECS[name]
    args = fn.__code__.co_varnames[:fn.__code__.co_argcount]
    if args != spec.params + tuple(c for c, _ in spec.consts):
        raise TypeError(f"{fn.__name__}{args} does not take the parameters of its spec {spec.params}")
    REGISTRY[name] = Kernel(name, fn, spec)
    return fn


def _act_(y: np.ndarray, act: int, tmp: np.ndarray) -> None:
    if act == ACT_SILU:  # y * sigmoid(y) = y / (1 + exp(-y))
        np.negative(y, out=tmp)
        np.exp(tmp, out=tmp)
        tmp += 1.0
        np.divide(y, tmp, out=y)
    elif act == ACT_TANH:
        np.tanh(y, out=y)
    elif act == ACT_RELU:
        np.maximum(y, 0.0, out=y)


@kernel
def obs_norm_ref(obs, mean, inv_std, x):
    """x[B,obs] = (obs - mean) * inv_std."""
    np.subtract(obs, mean, out=x)
    x *= inv_std


@kernel
def linear_ref(x, w, bias, y, tmp, act):
    """y[B,out] = act(x[B,in] @ w[in,out] + bias[out])."""
    np.matmul(x[:, None, :], w, out=y[:, None, :])
    y += bias
    _act_(y, act, tmp)


@kernel
def add_ref(x, y):
    """x[B,n] += y[B,n] (residual)."""
    x += y


@kernel
def rmsnorm_ref(x, g, y, ms):
    """y[B,n] = x / sqrt(mean(x^2) + eps) * g; ms[B,1,1] is the per-row mean square."""
    np.matmul(x[:, None, :], x[:, :, None], out=ms)
    ms *= np.float32(1.0 / x.shape[1])
    ms += RMS_EPS
    np.sqrt(ms, out=ms)
    np.divide(x, ms[:, :, 0], out=y)
    y *= g


@kernel
def causal_conv_ref(x, conv_state, w, bias, out, tmp):
    """Depthwise causal conv over the last k inputs, then x += silu(conv).

    x[B,d]; conv_state[B,k-1,d] holds the previous k-1 inputs, oldest first; w[k,d]; bias[d].
    """
    km1 = conv_state.shape[1]
    np.multiply(x, w[km1], out=out)
    out += bias
    for j in range(km1):
        np.multiply(conv_state[:, j], w[j], out=tmp)
        out += tmp
    for j in range(km1 - 1):  # shift left, one row at a time (no overlapping copy)
        conv_state[:, j] = conv_state[:, j + 1]
    conv_state[:, km1 - 1] = x
    _act_(out, ACT_SILU, tmp)
    x += out


@kernel
def gru_cell_ref(x, h, w_ih, w_hh, b_ih, b_hh, gi, gh, h_new):
    """GRU cell (PyTorch gate order r, z, n): h_new[B,H] from x[B,I], h[B,H].

    w_ih[I,3H], w_hh[H,3H]; gi, gh[B,3H] are scratch.
    """
    H = h.shape[1]
    np.matmul(x[:, None, :], w_ih, out=gi[:, None, :])
    gi += b_ih
    np.matmul(h[:, None, :], w_hh, out=gh[:, None, :])
    gh += b_hh
    rz = gi[:, :2 * H]
    rz += gh[:, :2 * H]
    np.negative(rz, out=rz)
    np.exp(rz, out=rz)
    rz += 1.0
    np.reciprocal(rz, out=rz)  # rz = sigmoid(.)
    r, z = gi[:, :H], gi[:, H:2 * H]
    n = gi[:, 2 * H:]
    gh_n = gh[:, 2 * H:]
    gh_n *= r
    n += gh_n
    np.tanh(n, out=n)
    # h_new = n + z * (h - n)  ==  (1 - z) * n + z * h
    np.subtract(h, n, out=h_new)
    h_new *= z
    h_new += n


@kernel
def gru_commit_ref(h, h_new, x):
    """recurrent_state = h_new (in place); x += h_new."""
    h[...] = h_new
    x += h_new


@kernel
def ssm_step_ref(x, xn, h, proj, a_log, d_skip, dt, u, decay, dbx, y):
    """Selective SSM step (kernels/ssm.cu): x[B,d] the residual, xn = rmsnorm(x), h[B,d,N], proj[B,d+2N] =
    [dt_raw | B | C] from xn; dt = softplus, h = exp(-dt exp(a_log)) h + dt xn B, x += sum_s h C + d_skip xn.
    dt, u, decay, dbx, y are scratch."""
    d, N = x.shape[1], h.shape[2]
    np.logaddexp(np.float32(0.0), proj[:, :d], out=dt)  # softplus
    np.multiply(dt, xn, out=u)
    decay[...] = a_log
    np.exp(decay, out=decay)
    np.multiply(decay, dt[:, :, None], out=decay)
    np.negative(decay, out=decay)
    np.exp(decay, out=decay)
    np.multiply(u[:, :, None], proj[:, None, d:d + N], out=dbx)
    h *= decay
    h += dbx
    np.multiply(h[:, :, 0], proj[:, d + N:d + N + 1], out=y)  # over s in order, as the kernel
    for s in range(1, N):
        np.multiply(h[:, :, s], proj[:, d + N + s:d + N + s + 1], out=u)
        y += u
    np.multiply(d_skip, xn, out=u)
    y += u
    x += y


def ssm_scan_ref(proj, xn, a_log, d_skip, h, y):
    """The sequence form (ssm_scan_f32): h0 = 0, y[n,d] the residual updates, h[d,N] the final state."""
    n, d = xn.shape
    N = h.shape[1]
    a = np.exp(a_log)
    dt = np.logaddexp(np.float32(0.0), proj[:, :d])
    u = dt * xn
    b_in, c_in = proj[:, d:d + N], proj[:, d + N:]
    decay, hs = np.empty((d, N), np.float32), np.zeros((d, N), np.float32)
    for t in range(n):
        np.multiply(a, dt[t, :, None], out=decay)
        np.negative(decay, out=decay)
        np.exp(decay, out=decay)
        hs *= decay
        hs += u[t, :, None] * b_in[t]
        np.matmul(hs, c_in[t], out=y[t])
    y += d_skip * xn
    h[...] = hs


def _window(meta, kv_window: int) -> tuple[int, int, int]:
    """(pos, first, count) of this step's window: positions first .. pos, count = min(kv_len + 1, W).
    Python ints, so a hostile meta wraps into range instead of indexing outside a buffer."""
    pos = int(meta[0, META_POS]) % (1 << 62)
    count = min(max(int(meta[0, META_KV_LEN]), 0) + 1, kv_window)
    return pos, pos - count + 1, count


@kernel
def kv_write_ref(qkv, k_log, v_log, meta, kv_pages):
    """Append this step's k, v (qkv[B,3d]) at position pos: k_log[page, pos % KV_PAGE] with page =
    kv_pages[b, (pos // KV_PAGE) % P]. k_log, v_log: [pages, KV_PAGE, d] (shared by all rows)."""
    n_pages, page_len, d = k_log.shape
    pos = int(meta[0, META_POS]) % (1 << 62)
    ring, slot = (pos // page_len) % kv_pages.shape[1], pos % page_len
    for b in range(qkv.shape[0]):
        page = int(kv_pages[b, ring]) % n_pages
        k_log[page, slot] = qkv[b, d:2 * d]
        v_log[page, slot] = qkv[b, 2 * d:]


def _mask_outside(a2: np.ndarray, first: int, count: int, value) -> None:
    """a2[..., R] over the ring of R = P * KV_PAGE positions: set every slot outside the window."""
    R = a2.shape[-1]
    lo, hi = first % R, (first + count) % R  # window = [lo, hi) cyclically; count < R
    if lo < hi:
        a2[..., :lo] = value
        a2[..., hi:] = value
    elif hi < lo:
        a2[..., hi:lo] = value


@kernel
def attn_decode_ref(qkv, k_log, v_log, meta, kv_pages, out, scores, chunk_m, chunk_l, chunk_acc, attn_max, attn_den,
                    part, ones, n_heads, kv_window):
    """Single-query attention over the window, split by page (chunk) and combined in a fixed order.

    q = qkv[B,:d]. The window is positions pos-T+1 .. pos (T = min(kv_len + 1, W); this step's k, v
    are already written), read from the log through kv_pages[B,P]. Chunk j (page slot j) holds the
    positions t with (t // KV_PAGE) % P == j, at slot t % KV_PAGE of scores[B,H,P,1,KV_PAGE]. Per
    chunk: m_j = max, l_j = sum exp(s - m_j), acc_j = sum exp(s - m_j) v; then out = sum_j acc_j w_j /
    sum_j l_j w_j with w_j = exp(m_j - max m). Which call computes what depends only on positions,
    never on where pages sit or which rows share them, so a branch is byte-identical to live
    stepping, and a restored capsule to its original run. Rows that share a chunk's page read it in
    one call for all their queries. part[B,H,P,hd+2] is the CUDA kernel's and unused here.
    """
    B, d = out.shape
    hd = d // n_heads
    P, page_len = kv_pages.shape[1], k_log.shape[1]
    pos, first, count = _window(meta, kv_window)
    q = qkv[:, :d].reshape(B, n_heads, 1, hd)
    s = scores  # [B,H,P,1,KV_PAGE]: every operand below is BLAS-shaped, so nothing is copied
    for j in range(P):
        pages = kv_pages[:, j]
        if (pages == pages[0]).all():  # shared by every row: one read for all queries
            kt = k_log[int(pages[0]) % k_log.shape[0]].reshape(page_len, n_heads, hd).transpose(1, 2, 0)
            np.matmul(q, kt, out=s[:, :, j])  # [B,H,1,hd] @ [H,hd,KV_PAGE]
        else:
            for b in range(B):
                kt = k_log[int(pages[b]) % k_log.shape[0]].reshape(page_len, n_heads, hd).transpose(1, 2, 0)
                np.matmul(q[b], kt, out=s[b, :, j])
    flat = s.reshape(B, n_heads, P * page_len)
    flat *= np.float32(1.0 / np.sqrt(hd))
    _mask_outside(flat, first, count, -np.inf)
    np.max(s, axis=4, keepdims=True, out=chunk_m)  # [B,H,P,1,1]; max is exact in any order
    np.maximum(chunk_m, np.float32(-3e38), out=chunk_m)  # an empty chunk: finite, weight 0 below
    s -= chunk_m
    np.maximum(s, SCORE_FLOOR, out=s)
    np.exp(s, out=s)
    _mask_outside(flat, first, count, 0.0)
    np.matmul(s, ones, out=chunk_l)  # [B,H,P,1,KV_PAGE] @ [KV_PAGE,1]
    for j in range(P):
        pages = kv_pages[:, j]
        acc = chunk_acc[:, :, j:j + 1]  # [B,H,1,hd]
        if (pages == pages[0]).all():
            vh = v_log[int(pages[0]) % v_log.shape[0]].reshape(page_len, n_heads, hd).transpose(1, 0, 2)
            np.matmul(s[:, :, j], vh, out=acc)  # [B,H,1,KV_PAGE] @ [H,KV_PAGE,hd]
        else:
            for b in range(B):
                vh = v_log[int(pages[b]) % v_log.shape[0]].reshape(page_len, n_heads, hd).transpose(1, 0, 2)
                np.matmul(s[b, :, j], vh, out=acc[b])
    m = chunk_m[..., 0]  # [B,H,P,1]
    np.max(m, axis=2, keepdims=True, out=attn_max)  # [B,H,1,1]
    m -= attn_max
    np.exp(m, out=m)  # w_j; 0 for empty chunks
    w = m.transpose(0, 1, 3, 2)  # [B,H,1,P]
    np.matmul(w, chunk_l[..., 0], out=attn_den)  # [B,H,1,1]
    w /= attn_den  # normalise the P weights rather than the hd outputs
    np.matmul(w, chunk_acc, out=out.reshape(B, n_heads, 1, hd))


@kernel
def temporal_ensemble_ref(chunk, mtp_state, meta, scale, offset, action, tmp, decay):
    """Blend the pending predictions for this step (ACT-style temporal ensemble), then map to the robot's units.

    chunk[B,K*A] is this step's prediction of actions t..t+K-1. mtp_state[B,K,K*A] is a ring of
    the last K chunks, slot = step % K. action[B,A] = (sum_age w(age) * chunk_{t-age}[age] / sum w) * scale
    + offset, w(age) = exp(-decay * age): decay > 0 weighs the newest chunk most, < 0 the oldest (ACT).
    """
    K = mtp_state.shape[1]
    A = action.shape[1]
    step = int(meta[0, META_STEP]) % (1 << 62)  # as the kernel: unsigned, never a negative slot
    mtp_state[:, step % K] = chunk
    action[...] = 0.0
    wsum = 0.0
    for age in range(min(step + 1, K)):
        w = np.float32(np.exp(-float(decay) * age))
        np.multiply(mtp_state[:, (step - age) % K, age * A:(age + 1) * A], w, out=tmp)
        action += tmp
        wsum += float(w)
    action *= np.float32(1.0 / wsum)
    action *= scale
    action += offset


def _mix32(h: np.ndarray) -> np.ndarray:
    h ^= h >> np.uint32(16)
    h *= np.uint32(0x85EBCA6B)
    h ^= h >> np.uint32(13)
    h *= np.uint32(0xC2B2AE35)
    h ^= h >> np.uint32(16)
    return h


def rng_uniform(seed: int, counter: int, index: np.ndarray, stream: int) -> np.ndarray:
    """Counter-based uniform in (0, 1): a hash of (seed, counter, index, stream). Same in CUDA."""
    h = index.astype(np.uint32) * np.uint32(0x9E3779B1)
    h ^= np.uint32((seed * 0x632BE5AB + counter * 0x27D4EB2F + stream * 0x165667B1) & 0xFFFFFFFF)
    h = _mix32(h)
    h ^= np.uint32((counter >> 32) & 0xFFFFFFFF)
    h = _mix32(h)
    return ((h >> np.uint32(8)).astype(np.float32) + np.float32(0.5)) * np.float32(1.0 / (1 << 24))


@kernel
def rng_noise_ref(action, meta, seed, std):
    """action[B,A] += std * N(0,1), Box-Muller over a counter-based hash keyed by meta's rng_counter.

    The only twin with temporaries (a few A-sized arrays); it is absent from the plan when std = 0.
    """
    counter = int(meta[0, META_RNG])
    idx = np.arange(action.shape[1], dtype=np.uint32)
    u1 = rng_uniform(seed, counter, idx, 0)
    u2 = rng_uniform(seed, counter, idx, 1)
    z = np.sqrt(np.float32(-2.0) * np.log(u1)) * np.cos(np.float32(2 * np.pi) * u2)
    action += np.float32(std) * z


def advance_meta(meta, n: int, kv_window: int) -> None:
    """meta[B, META_LEN] after n more steps: step, position and rng_counter += n, kv_len = min(kv_len + n, W).
    The one definition: the step twin takes n = 1, cold prefill n = the history (kernels/head.cu is the CUDA
    twin of n = 1)."""
    meta[:, META_STEP] += n
    meta[:, META_POS] += n
    kv = meta[:, META_KV_LEN]
    kv += n
    np.minimum(kv, kv_window, out=kv)
    meta[:, META_RNG] += n


@kernel
def meta_advance_ref(meta, kv_window):
    """Last op of a step: step += 1, position += 1, kv_len = min(kv_len + 1, W), rng_counter += 1."""
    advance_meta(meta, 1, kv_window)
