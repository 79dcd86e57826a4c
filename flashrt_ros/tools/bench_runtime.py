"""`flashrt-bench runtime`: capsule copies vs memcpy, rollback + re-plan vs cold recompute.

Everything is measured side by side in one run (ratios, not absolute times, are what transfer
between noisy machines). Medians unless a key says otherwise.
"""
from __future__ import annotations

import time

import numpy as np

from ..runtime import PolicyConfig, Session
from ..runtime.kernels import REGISTRY
from .common import p50_p99, progress, synthetic_trace, timed_ms

COLD_REPLAY_LIMIT_S = 30.0


def _median(xs) -> float:
    return round(float(np.median(xs)), 4)


def history_point(cfg: PolicyConfig, backend: str, history: int) -> dict:
    cfg = cfg.replace(kv_window=history, max_branches=1, capsule_capacity=4, capsule_budget_mb=1e6)
    s = Session(cfg, backend)
    obs = synthetic_trace(history + 64, cfg.obs_dim, seed=history)
    xp = s.backend.xp

    progress(f"history {history}: cold prefill")
    reps = 3 if history <= 4096 else 1
    prefill = timed_ms(lambda: s.prefill_from(obs[:history]), 1, warmup=0)
    prefill += timed_ms(s.cold_prefill, reps - 1, warmup=0)
    base = s.snapshot(label="bench base", pin=True)

    step_ms = _median(timed_ms(lambda: s.step(obs[history]), 3))  # estimate for the replay cutoff
    s.rollback(base.id)
    replay = None
    if step_ms * history / 1e3 < COLD_REPLAY_LIMIT_S:
        progress(f"history {history}: cold replay (~{step_ms * history / 1e3:.0f} s)")
        replay = _median(timed_ms(s.cold_replay, 1, warmup=0))
        s.rollback(base.id)
    else:
        progress(f"history {history}: cold replay skipped "
                 f"(~{step_ms * history / 1e3:.0f} s > {COLD_REPLAY_LIMIT_S:.0f} s)")

    progress(f"history {history}: snapshot / restore / memcpy")
    row = s.live_row()
    with s.backend.activate():
        dst = xp.empty_like(row)
        dst[...] = 1  # fault the pages in, as the store's slots are
    s.backend.sync()
    snap, mem, rest = [], [], []
    for _ in range(15):  # interleaved so that all three see the same machine state
        snap += timed_ms(lambda: (s.store.drop(s.snapshot().id), s.backend.sync()), 1, warmup=0)
        mem += timed_ms(lambda: (s.backend.copy(dst, row), s.backend.sync()), 1, warmup=0)
        rest += timed_ms(lambda: (s.store.restore(base.id, row), s.backend.sync()), 1, warmup=0)

    progress(f"history {history}: rollback + 8-step re-plan")
    plan_obs = obs[None, history:history + 8]

    def rollback_replan():
        s.rollback(base.id)
        r = s.replan(base.id, plan_obs, deadline_ms=1e9)
        s.store.drop(r.branch_capsule_ids[0])

    rr = _median(timed_ms(rollback_replan, 5))
    pf = _median(prefill)
    return {"history": history, "state_bytes": s.arena.row_nbytes, "snapshot_ms": _median(snap),
            "restore_ms": _median(rest), "memcpy_ms": _median(mem), "cold_replay_ms": replay,
            "cold_prefill_ms": pf, "rollback_replan_ms": rr, "speedup_vs_prefill": round(pf / rr, 2),
            "step_ms_at_full_window": step_ms}


def default_point(cfg: PolicyConfig, backend: str) -> dict:
    progress("default config: step latency, 4x8 replan, KV-only ablation")
    s = Session(cfg, backend)
    obs = synthetic_trace(900, cfg.obs_dim)
    lat = [s.step(o).latency_ms for o in obs[:600]]
    base = s.store.pin(s.live_capsule_id).id
    branches = np.stack([obs[600:608] + 0.1 * b for b in range(4)]).astype(np.float32)
    replan = timed_ms(lambda: _whatif(s, base, branches), 60, warmup=3)

    reference = np.stack([s.step(o).action for o in obs[600:616]])
    for o in obs[616:800]:
        s.step(o)
    s.restore_roles(base, ("kv", "meta"))
    kv_only = np.stack([s.step(o).action for o in obs[600:616]])
    s.rollback(base)
    full = np.stack([s.step(o).action for o in obs[600:616]])
    return {"backend": s.backend.name, "step_latency_ms": p50_p99(lat), "replan_4x8_ms": p50_p99(replan),
            "kv_only_max_abs_diff": float(np.abs(kv_only - reference).max()),
            "full_restore_max_abs_diff": float(np.abs(full - reference).max())}


def _whatif(s: Session, base: int, branches: np.ndarray) -> None:
    r = s.replan(base, branches, deadline_ms=1e9)
    for cid in r.branch_capsule_ids:
        s.store.drop(cid)


def kv_layout_point(cfg: PolicyConfig, history: int) -> dict:
    """Attention read time per step, all layers, for the two KV layouts (NumPy twin, T = W)."""
    progress(f"KV layout at {history}: per-layer rows vs time-major")
    d, L, H = cfg.d_model, cfg.n_layers, cfg.n_heads
    rng = np.random.default_rng(0)
    per_layer = [rng.standard_normal((2, 1, history, d), dtype=np.float32) for _ in range(L)]  # [k|v, B, W, d]
    time_major = rng.standard_normal((1, history, L, 2, d), dtype=np.float32)  # [B, W, layer, k|v, d]
    qkv = rng.standard_normal((1, 3 * d), dtype=np.float32)
    meta = np.zeros((1, 8), np.int64)
    meta[0, 2] = history
    out = np.empty((1, d), np.float32)
    scratch = (np.empty((1, H, history, 1), np.float32), np.empty((1, H, 1, 1), np.float32),
               np.empty((1, H, 1, 1), np.float32), None, np.ones((history, 1), np.float32))  # part: CUDA only
    attn = REGISTRY["attn_decode"].ref

    def run_per_layer():
        for kv in per_layer:
            attn(qkv, kv[0], kv[1], meta, out, *scratch, n_heads=H)

    def run_time_major():
        for layer in range(L):
            attn(qkv, time_major[:, :, layer, 0], time_major[:, :, layer, 1], meta, out, *scratch, n_heads=H)

    a, b = [], []
    for _ in range(5):
        a += timed_ms(run_per_layer, 1, warmup=0)
        b += timed_ms(run_time_major, 1, warmup=0)
    return {"history": history, "per_layer_rows_ms": _median(a), "time_major_ms": _median(b),
            "kept": "per_layer_rows" if np.median(a) <= np.median(b) else "time_major"}


def run(args) -> dict:
    t0 = time.perf_counter()
    cfg = PolicyConfig.from_yaml(args.config) if args.config else PolicyConfig()
    histories = [int(h) for h in args.histories.split(",") if h]
    out = default_point(cfg, args.backend)
    out["kv_layout"] = kv_layout_point(cfg, max(histories))
    out["histories"] = []
    for h in histories:
        out["histories"].append(history_point(cfg, args.backend, h))
        progress(f"history {h}: {out['histories'][-1]}")
    out["wall_s"] = round(time.perf_counter() - t0, 1)
    return out
