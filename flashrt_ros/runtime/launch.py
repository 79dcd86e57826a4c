"""Launch table: plan op -> CUDA C kernel, grid, block and argument list.

Shared by the CUDA backend (CuPy arrays) and the CPU shim used in tests (NumPy arrays), so the
tests exercise exactly the launches a GPU gets. Every launcher asserts its sizes: CUDA kernels
trust what they are given. Batched buffers go as (array, row stride in elements).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .kernels import KV_PAGE  # log entries per page = keys per attention block, as in attention.cu

I32, I64, U32, F32 = np.int32, np.int64, np.uint32, np.float32
ATTN_THREADS = 128  # must match kernels/attention.cu
ATTN_MAX_HD = 64
GRU_SCAN_MAX_H = 512  # must match kernels/recurrent.cu (and GRU_SCAN_THREADS there)



@dataclass(frozen=True)
class Launch:
    source: str  # kernels/<source>
    function: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    args: tuple  # arrays and NumPy scalars


def rs(a) -> np.int64:
    """Row stride in elements."""
    return I64(a.strides[0] // a.itemsize)


def _cdiv(a: int, b: int) -> int:
    return (a + b - 1) // b


def _flat(n: int, threads: int = 128) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    return (max(1, _cdiv(n, threads)), 1, 1), (threads, 1, 1)


def _check(cond: bool, what: str) -> None:
    if not cond:
        raise ValueError(f"launch: {what}")


def _f32(*arrays) -> None:
    for a in arrays:
        _check(a.dtype == np.float32, f"expected float32, got {a.dtype}")


def obs_norm(obs, mean, inv_std, x):
    B, n = x.shape
    _f32(obs, mean, inv_std, x)
    _check(obs.shape == (B, n) and mean.shape == inv_std.shape == (n,), f"obs_norm shapes {obs.shape} {mean.shape}")
    return Launch("dense.cu", "obs_norm_f32", *_flat(B * n), (obs, rs(obs), mean, inv_std, x, rs(x), I32(B), I32(n)))


def linear(x, w, b, y, tmp, act):
    B, n_in = x.shape
    n_out = w.shape[1]
    _f32(x, w, b, y)
    _check(w.shape == (n_in, n_out) and b.shape == (n_out,) and y.shape == (B, n_out),
           f"linear shapes x{x.shape} w{w.shape} b{b.shape} y{y.shape}")
    return Launch("dense.cu", "linear_f32", *_flat(B * n_out * 32),  # a warp per output
                  (x, rs(x), w, b, y, rs(y), I32(B), I32(n_in), I32(n_out), I32(act)))


def add(x, y):
    B, n = x.shape
    _f32(x, y)
    _check(y.shape == (B, n), f"add shapes {x.shape} {y.shape}")
    return Launch("dense.cu", "add_f32", *_flat(B * n), (x, rs(x), y, rs(y), I32(B), I32(n)))


def rmsnorm(x, g, y, ms):
    B, n = x.shape
    _f32(x, g, y)
    _check(g.shape == (n,) and y.shape == (B, n), f"rmsnorm shapes {x.shape} {g.shape} {y.shape}")
    return Launch("dense.cu", "rmsnorm_f32", (B, 1, 1), (32, 1, 1), (x, rs(x), g, y, rs(y), I32(B), I32(n)))


def causal_conv(x, conv_state, w, b, out, tmp):
    B, d = x.shape
    k = w.shape[0]
    _f32(x, conv_state, w, b, out)
    _check(k >= 2 and conv_state.shape == (B, k - 1, d) and w.shape == (k, d) and b.shape == (d,)
           and out.shape == (B, d), f"causal_conv shapes x{x.shape} state{conv_state.shape} w{w.shape}")
    _check(conv_state.strides[1:] == (d * 4, 4), "conv_state rows must be contiguous")
    return Launch("recurrent.cu", "causal_conv_f32", *_flat(B * d),
                  (x, rs(x), conv_state, rs(conv_state), w, b, out, rs(out), I32(B), I32(d), I32(k)))


def gru_cell(x, h, w_ih, w_hh, b_ih, b_hh, gi, gh, h_new):
    B, n_in = x.shape
    H = h.shape[1]
    _f32(x, h, w_ih, w_hh, b_ih, b_hh, h_new)
    _check(h.shape == (B, H) and w_ih.shape == (n_in, 3 * H) and w_hh.shape == (H, 3 * H)
           and b_ih.shape == b_hh.shape == (3 * H,) and h_new.shape == (B, H), "gru_cell shapes")
    return Launch("recurrent.cu", "gru_cell_f32", *_flat(B * H * 32),  # a warp per hidden unit
                  (x, rs(x), h, rs(h), w_ih, w_hh, b_ih, b_hh, h_new, rs(h_new), I32(B), I32(n_in), I32(H)))


def gru_commit(h, h_new, x):
    B, H = h.shape
    _f32(h, h_new, x)
    _check(h_new.shape == x.shape == (B, H), "gru_commit shapes")
    return Launch("recurrent.cu", "gru_commit_f32", *_flat(B * H),
                  (h, rs(h), h_new, rs(h_new), x, rs(x), I32(B), I32(H)))


def _log_args(k_log, v_log, meta, kv_pages):
    n_pages, page_len, d = k_log.shape
    _check(page_len == KV_PAGE and v_log.shape == k_log.shape and k_log.flags.c_contiguous
           and v_log.flags.c_contiguous, f"KV log must be contiguous [pages, {KV_PAGE}, d], got {k_log.shape}")
    _check(meta.dtype == np.int64 and kv_pages.dtype == np.int64, "meta and kv_pages must be int64")
    _check(kv_pages.shape[0] == meta.shape[0] and kv_pages.strides[1] == 8, "kv_pages rows must be contiguous")
    return n_pages, d


def kv_write(qkv, k_log, v_log, meta, kv_pages):
    B = qkv.shape[0]
    n_pages, d = _log_args(k_log, v_log, meta, kv_pages)
    _f32(qkv, k_log, v_log)
    _check(qkv.shape == (B, 3 * d), f"kv_write shapes qkv{qkv.shape} log{k_log.shape}")
    return Launch("attention.cu", "kv_write_f32", *_flat(B * d),
                  (qkv, rs(qkv), k_log, v_log, I64(n_pages), meta, rs(meta), kv_pages, rs(kv_pages),
                   I32(kv_pages.shape[1]), I32(B), I32(d)))


def attn_decode(qkv, k_log, v_log, meta, kv_pages, out, scores, chunk_m, chunk_l, chunk_acc, attn_max, attn_den,
                part, ones, n_heads, kv_window):
    """Two launches: per-chunk partial softmax-attention over the paged log, then the in-order combine."""
    B = qkv.shape[0]
    n_pages, d = _log_args(k_log, v_log, meta, kv_pages)
    hd = d // n_heads
    P = kv_pages.shape[1]
    _f32(qkv, k_log, v_log, out, scores, part)
    _check(d % n_heads == 0 and hd <= ATTN_MAX_HD, f"head_dim {d}/{n_heads} must be an integer <= {ATTN_MAX_HD}")
    _check(P * KV_PAGE >= kv_window + KV_PAGE, f"kv_pages: {P} slots cannot cover a window of {kv_window}")
    _check(qkv.shape == (B, 3 * d) and out.shape == (B, d) and scores.shape == (B, n_heads, P, 1, KV_PAGE)
           and scores.flags.c_contiguous and part.shape == (B, n_heads, P, hd + 2),
           f"attn_decode shapes qkv{qkv.shape} scores{scores.shape} part{part.shape}")
    return (Launch("attention.cu", "attn_partial_f32", (B * n_heads, P, 1), (ATTN_THREADS, 1, 1),
                   (qkv, rs(qkv), k_log, v_log, I64(n_pages), meta, rs(meta), kv_pages, rs(kv_pages), scores,
                    rs(scores), part, rs(part), I32(B), I32(kv_window), I32(d), I32(n_heads))),
            Launch("attention.cu", "attn_combine_f32", (B * n_heads, 1, 1), (max(32, _cdiv(hd, 32) * 32), 1, 1),
                   (part, rs(part), out, rs(out), I32(B), I32(d), I32(n_heads), I32(P))))


def temporal_ensemble(chunk, mtp_state, meta, action, tmp):
    B, A = action.shape
    K = mtp_state.shape[1]
    _f32(chunk, mtp_state, action)
    _check(chunk.shape == (B, K * A) and mtp_state.shape == (B, K, K * A), "temporal_ensemble shapes")
    return Launch("head.cu", "temporal_ensemble_f32", (B, 1, 1), (64, 1, 1),
                  (chunk, rs(chunk), mtp_state, rs(mtp_state), meta, rs(meta), action, rs(action),
                   I32(B), I32(K), I32(A)))


def rng_noise(action, meta, seed, std):
    B, A = action.shape
    _f32(action)
    return Launch("head.cu", "rng_noise_f32", *_flat(B * A, 64),
                  (action, rs(action), meta, rs(meta), I32(B), I32(A), U32(seed & 0xFFFFFFFF), F32(std)))


def meta_advance(meta, kv_window):
    B = meta.shape[0]
    _check(meta.dtype == np.int64 and meta.shape[1] >= 4, "meta must be int64 [B, >=4]")
    return Launch("head.cu", "meta_advance_i64", *_flat(B, 32), (meta, rs(meta), I32(B), I32(kv_window)))


LAUNCHERS = {f.__name__: f for f in (obs_norm, linear, add, rmsnorm, causal_conv, gru_cell, gru_commit, kv_write,
                                     attn_decode, temporal_ensemble, rng_noise, meta_advance)}


def gru_scan(gi, w_hh, b_hh, hs):
    """Cold prefill's whole-sequence GRU (not a plan op): one persistent block; S lanes per hidden unit,
    S the largest power of two <= 32 with H * S <= GRU_SCAN_MAX_H threads."""
    _f32(gi, w_hh, b_hh, hs)
    n, G = gi.shape
    H = G // 3
    _check(G == 3 * H and 1 <= H <= GRU_SCAN_MAX_H, f"gru_scan: H must be 1..{GRU_SCAN_MAX_H}, got gi {gi.shape}")
    _check(w_hh.shape == (H, G) and b_hh.shape == (G,) and hs.shape == (n, H), "gru_scan shapes")
    _check(all(a.flags.c_contiguous for a in (gi, w_hh, b_hh, hs)), "gru_scan: contiguous buffers required")
    S = 1
    while S < 32 and 2 * S * H <= GRU_SCAN_MAX_H:
        S *= 2
    block = _cdiv(H * S, 32) * 32
    args = (gi, w_hh, b_hh, hs, I32(n), I32(H), I32(S))
    return Launch("recurrent.cu", "gru_scan_f32", (1, 1, 1), (block, 1, 1), args)


def op_views(op, arena, start: int, count: int) -> list:
    """The op's buffers, row-sliced to [start, start + count) (weights whole)."""
    out = []
    for a in op.args:
        v = arena[a]
        out.append(v[start:start + count] if arena.placements[a].spec.per_row else v)
    return out


def op_launches(op, arena, start: int, count: int) -> tuple[Launch, ...]:
    la = LAUNCHERS[op.kernel](*op_views(op, arena, start, count), **op.const_dict())
    return la if isinstance(la, tuple) else (la,)


def launches_for(plan, arena, start: int, count: int) -> list[Launch]:
    return [la for op in plan.ops for la in op_launches(op, arena, start, count)]


def kernel_dir() -> Path:
    """kernels/ of the source tree, or share/flashrt_ros/kernels of an install."""
    here = Path(__file__).resolve()
    candidates = [here.parents[2] / "kernels"]
    try:
        from ament_index_python.packages import get_package_share_directory
        candidates.append(Path(get_package_share_directory("flashrt_ros")) / "kernels")
    except Exception:  # noqa: BLE001 - not installed through ament; the source tree is enough
        pass
    for c in candidates:
        if (c / "common.cuh").exists():
            return c
    raise FileNotFoundError(f"CUDA kernel sources not found in {[str(c) for c in candidates]}")
