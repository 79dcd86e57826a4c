"""Capsule-store measurements shared by `flashrt-bench runtime` and `flashrt-bench gpu`.

Bytes per capsule (predicted and measured from store growth), rollback depth (the sizing formula and
a measured run past the start of eviction), the per-step cost of taking a capsule, and replan with
the shared window vs a whole-window copy per branch. Every A/B pair is interleaved, alternating the
order, so the noise of a shared machine hits both sides alike; ratios are of medians.
"""
from __future__ import annotations

import time

import numpy as np

from ...runtime import PolicyConfig, Session
from ...runtime.model.kernels import KV_PAGE, META_KV_LEN, window_pages
from ...runtime.state.sizing import StoreSizes
from ..common import p50_p99, progress

RATE_HZ = 100.0  # the control rate at which rollback depth is quoted in seconds
NEVER = 2**62  # capsule_every_n_steps that never comes round: the "no capsule" arm


def stats_ms(samples) -> dict:
    out = p50_p99(samples)
    out["mean"] = round(float(np.mean(samples)), 4) if len(samples) else None
    return out


def ratio(a, b) -> float | None:
    return round(float(a) / float(b), 3) if a is not None and b else None


def full_row_capsule_bytes(cfg: PolicyConfig, record_nbytes: int) -> int:
    """What one capsule cost before the KV log: the small state plus a private copy of the window."""
    return record_nbytes + cfg.n_layers * 2 * cfg.kv_window * cfg.d_model * 4


def live_kv_len(s: Session) -> int:
    return int(s.backend.to_host(s.arena["meta"][0])[META_KV_LEN])


def budget_mb_for_depth(cfg: PolicyConfig, depth_steps: int) -> float:
    """A budget whose store holds about ``depth_steps`` capsules of one timeline (the sizing rule)."""
    sz = StoreSizes.plan(cfg)
    # whole pages for the window: StoreSizes.plan counts kv_window entries when it derives the records but
    # wants window_pages whole pages when it checks, and refuses budgets in between
    fixed = (sz.reserve_pages + window_pages(cfg.kv_window)) * KV_PAGE * sz.entry_nbytes
    return (fixed + depth_steps * (sz.record_nbytes + sz.entry_nbytes)) / 2**20


# ---- bytes -------------------------------------------------------------------------------
def capsule_bytes_per_step(s: Session, obs: np.ndarray) -> dict:
    """Step len(obs) times (a multiple of KV_PAGE, starting on a page boundary, so the log's page
    allocations amortise exactly) and divide the store's growth by the steps."""
    if s.cfg.capsule_every_n_steps != 1 or s.step_count % KV_PAGE or len(obs) % KV_PAGE:
        raise ValueError("capsule_bytes_per_step: needs a capsule every step and whole pages of steps")
    u0 = s.store_usage()
    for o in obs:
        s.step(o)
    u1 = s.store_usage()
    n = len(obs)
    evicted = u1.capsules - u0.capsules != n  # then the growth understates the cost
    return {"kv_window": s.cfg.kv_window, "record_bytes": s.arena.row_nbytes, "kv_entry_bytes": s.sizes.entry_nbytes,
            "predicted": s.store.capsule_nbytes, "measured": (u1.bytes_used - u0.bytes_used) / n,
            "steps": n, "eviction_during_measure": evicted,
            "full_row_capsule_bytes": full_row_capsule_bytes(s.cfg, s.arena.row_nbytes)}


# ---- rollback depth ----------------------------------------------------------------------
def rollback_depth_formula(cfg: PolicyConfig, windows) -> dict:
    """Seconds of rollback at RATE_HZ that the sizing rule promises (what Session.sizes reports)."""
    out = {"rate_hz": RATE_HZ, "budget_mb": cfg.capsule_budget_mb}
    for w in windows:
        sz = StoreSizes.plan(cfg.replace(kv_window=w))
        out[f"kv_window_{w}"] = round(sz.rollback_depth_steps / RATE_HZ, 2)
        out[f"kv_window_{w}_detail"] = {"rollback_depth_steps": sz.rollback_depth_steps, "records": sz.records,
                                        "log_pages": sz.log_pages, "record_bytes": sz.record_nbytes}
    return out


def log_bound_config(cfg: PolicyConfig, depth_steps: int) -> PolicyConfig:
    """KV log pages for about ``depth_steps`` entries beside the window (never fewer than the reserves
    need) and records to spare: the log, not the records, limits the depth. max_branches 1 keeps the
    replan reserve, and so the smallest possible log, small."""
    cfg = cfg.replace(max_branches=1)
    sz = StoreSizes.plan(cfg)
    pages = max(sz.reserve_pages + window_pages(cfg.kv_window),
                -(-(depth_steps + cfg.kv_window + 2 * KV_PAGE) // KV_PAGE))
    records = 2 * pages * KV_PAGE  # more than the pages can ever back
    budget = records * sz.record_nbytes + pages * KV_PAGE * sz.entry_nbytes + 1  # +1 B: float round trip
    return cfg.replace(capsule_capacity=records, capsule_budget_mb=budget / 2**20)


def verify_rollback_depth(cfg: PolicyConfig, backend, depth_steps: int, trace, bound: str = "records") -> dict:
    """Run a small budget well past the start of eviction; compare the depth the store keeps with the
    depth the sizing rule predicts, and restore the oldest capsule to show it is really there.
    ``bound``: "records" (a budget-derived store: records run out first) or "log" (spare records)."""
    cfg = cfg.replace(capsule_every_n_steps=1)
    if bound == "records":
        cfg = cfg.replace(capsule_budget_mb=budget_mb_for_depth(cfg, depth_steps), capsule_capacity=0)
    else:
        cfg = log_bound_config(cfg, depth_steps)
    s = Session(cfg, backend)
    predicted = s.sizes.rollback_depth_steps
    n = predicted + cfg.kv_window + 4 * KV_PAGE  # eviction starts before `predicted`; go a window and 4 pages past
    obs = trace(n)
    progress(f"rollback depth check ({bound} bound): {n} steps at {cfg.capsule_budget_mb:.1f} MB, "
             f"kv_window {cfg.kv_window}")
    evict_at, seen = None, []
    for i, o in enumerate(obs):
        s.step(o)
        if evict_at is None and s.store_usage().oldest_step > 1:
            evict_at = i + 1
        elif evict_at is not None and i % 8 == 0:
            seen.append(s.store_usage().rollback_depth_steps)
    u = s.store_usage()
    oldest = s.list_capsules()[0]
    s.rollback(oldest.id)  # the oldest capsule the store still claims is restorable
    return {"bound": bound, "budget_mb": round(cfg.capsule_budget_mb, 3), "kv_window": cfg.kv_window,
            "max_branches": cfg.max_branches,
            "records": s.sizes.records, "log_pages": s.sizes.log_pages, "steps_run": n,
            "eviction_started_at_step": evict_at, "predicted_steps": predicted,
            "measured_steps": u.rollback_depth_steps,
            "measured_min_steps": min(seen, default=None), "measured_max_steps": max(seen, default=None),
            "measured_over_predicted": ratio(min(seen, default=u.rollback_depth_steps), predicted),
            "oldest_restored_step": oldest.step}


# ---- per-step capsule cost ---------------------------------------------------------------
def step_capsule_overhead(s: Session, obs: np.ndarray) -> dict:
    """Alternate steps with and without a capsule on one session (the config swap changes nothing
    but capsule_every_n_steps, which step() reads each call). Step latency as StepResult reports it."""
    with_cfg = s.cfg
    without_cfg = with_cfg.replace(capsule_every_n_steps=NEVER)
    arms = {"with": [], "without": []}
    try:
        for i in range(0, len(obs) - 1, 2):
            order = ("with", "without") if i % 4 == 0 else ("without", "with")
            for arm, o in zip(order, obs[i:i + 2]):
                s.cfg = with_cfg if arm == "with" else without_cfg
                arms[arm].append(s.step(o).latency_ms)
    finally:
        s.cfg = with_cfg
    w, wo = stats_ms(arms["with"]), stats_ms(arms["without"])
    u = s.store_usage()
    return {"kv_window": s.cfg.kv_window, "kv_len": live_kv_len(s), "pairs": len(arms["with"]),
            "with_capsule_ms": w, "without_capsule_ms": wo,
            "overhead": round((w["p50"] - wo["p50"]) / wo["p50"], 4),
            "overhead_mean": round((w["mean"] - wo["mean"]) / wo["mean"], 4),
            "store_full": u.capsules >= u.capacity or u.log_entries_used >= u.log_entries_total - 2 * KV_PAGE}


# ---- replan: shared window vs a copy per branch ------------------------------------------
def replan_ab(s: Session, branches: int, horizon: int, obs: np.ndarray, reps: int, warmup: int = 2,
              split_threads: int = 2, idle_s: float = 0.0) -> dict:
    """Replan from a pinned capsule of the live state, interleaving the shared-window fork on one thread, the
    whole-window copy fork (copy_fork=True), on a backend that splits rows over threads the shared fork on
    ``split_threads`` threads (replan_threads) and, with ``idle_s``, the shared fork after that long idle (as a
    planner's replans come: the caches may have lost the weights and the window meanwhile); branch capsules are
    dropped between runs."""
    base = s.snapshot(label="bench replan base", pin=True)
    plan = np.stack([obs[:horizon] + 0.1 * b for b in range(branches)]).astype(np.float32)
    arms = {"shared": (False, 1, 0.0), "copy_fork": (True, 1, 0.0)}  # (copy_fork, replan_threads, idle before)
    if getattr(s.backend, "splits_rows", False):
        arms["split"] = (False, split_threads, 0.0)
    if idle_s > 0:
        arms["after_idle"] = (False, 1, idle_s)
    samples = {name: [] for name in arms}
    threads_before = s.replan_threads

    def once(copy_fork: bool, threads: int, idle: float) -> float:
        if idle:
            time.sleep(idle)
        s.replan_threads = threads
        r = s.replan(base.id, plan, copy_fork=copy_fork)
        for cid in r.branch_capsule_ids:
            s.drop(cid)
        return r.elapsed_ms

    names = list(arms)
    try:
        for i in range(warmup + reps):
            for name in names[i % len(names):] + names[:i % len(names)]:  # each arm first in turn
                ms = once(*arms[name])
                if i >= warmup:
                    samples[name].append(ms)
    finally:
        s.replan_threads = threads_before
        s.unpin(base.id)
    shared, copied = stats_ms(samples["shared"]), stats_ms(samples["copy_fork"])
    kv_len = live_kv_len(s)
    out = {"case": f"{branches}x{horizon}@{s.cfg.kv_window}", "kv_window": s.cfg.kv_window,
           "kv_len": kv_len, "kv_fill": f"{kv_len}/{s.cfg.kv_window}", "step": s.step_count,
           "reps": reps, "shared": shared, "copy_fork": copied,
           "copy_fork_over_shared": ratio(copied["p50"], shared["p50"])}
    if "split" in samples:
        split = stats_ms(samples["split"])
        out["split"] = {"threads": split_threads, **split, "speedup_p50": ratio(shared["p50"], split["p50"]),
                        "speedup_p99": ratio(shared["p99"], split["p99"])}
    if "after_idle" in samples:
        idle = stats_ms(samples["after_idle"])
        out["after_idle"] = {"idle_ms": round(idle_s * 1e3, 1), **idle,
                             "over_back_to_back_p50": ratio(idle["p50"], shared["p50"])}
    return out

