"""`flashrt-bench runtime`: the capsule store against its baselines, side by side in one run.

Per attention window (one session each, windows filled before anything is timed): snapshot and
restore vs a memcpy of the capsule's own bytes, rollback + re-plan vs tuned cold prefill and cold
replay, the per-step cost of a capsule, and replan with the shared window vs a whole-window copy per
branch, and the same replan after an idle gap (as a planner's come). Plus bytes per capsule and rollback
depth, predicted and measured. Ratios, not absolute times, are what transfer between noisy machines.
Progress goes to stderr.
"""
from __future__ import annotations

import gc
import time
from dataclasses import dataclass

import numpy as np

from ...runtime import PolicyConfig, Session
from ...runtime.model.kernels import KV_PAGE
from ..common import p50_p99, progress, synthetic_trace, timed_ms
from .floor import core_peaks, replan_floor
from .measure import (
    capsule_bytes_per_step,
    full_row_capsule_bytes,
    live_kv_len,
    replan_ab,
    rollback_depth_formula,
    step_capsule_overhead,
    verify_rollback_depth,
)

SPEEDUP_VS = "tuned cold prefill on the same backend"
COPY_FORK_VS = "shared-window replan of the same case, same run, same backend"
AFTER_IDLE_VS = "the same replan back to back (replan_ms), interleaved in the same run"
QUICK_BUDGET_MB = 64.0
PAST_FULL = 64  # steps taken past a full window before full-window measurements (the ring has wrapped)


@dataclass(frozen=True)
class Plan:
    """What one run measures. `full` is the default; `quick` is the same code at toy sizes (tests)."""
    histories: tuple[int, ...]
    overhead_windows: tuple[int, ...]
    replan_cases: tuple[tuple[int, int, int], ...]  # (branches, horizon, kv_window)
    depth_windows: tuple[int, ...]  # rollback depth from the sizing rule at the default budget
    default_window: int
    history_budget_mb: float | None  # windows measured only for the history keys (None: the config's)
    depth_check_steps: int  # target depth of the small-budget empirical check
    overhead_pairs: int
    replan_reps: int
    snapshot_reps: int
    bytes_steps: int
    replay_limit_s: float
    quick: bool = False
    # the same replan after this long idle, beside the back-to-back one: a planner replans every 0.5 s in the
    # mission, and 50 ms is already enough for a shared L3 to lose the step's weights and window
    replan_idle_s: float = 0.05

    @classmethod
    def full(cls, histories) -> Plan:
        return cls(histories or (2048, 4096, 8192, 16384), (1024, 16384), ((4, 8, 1024), (8, 8, 1024), (4, 8, 4096)),
                   (1024, 16384), 1024, 256.0, 1024, 200, 40, 15, 4 * KV_PAGE, 12.0)

    @classmethod
    def quick_(cls, histories) -> Plan:
        return cls(histories or (128, 256), (128,), ((4, 8, 128), (8, 8, 128), (4, 8, 256)), (1024, 16384), 128,
                   None, 120, 16, 3, 4, KV_PAGE, 2.0, quick=True, replan_idle_s=0.005)


def _median(xs) -> float:
    return round(float(np.median(xs)), 4)


def history_point(s: Session, obs: np.ndarray, plan: Plan) -> dict:
    """The window filled by cold prefill of `history` = kv_window observations, then the keep-keys."""
    history = s.cfg.kv_window
    progress(f"history {history}: cold prefill")
    reps = 3  # the median of 3: one sample hit by a noisy neighbour does not set the figure
    prefill = timed_ms(lambda: s.prefill_from(obs[:history]), 1, warmup=0)
    prefill += timed_ms(s.cold_prefill, reps - 1, warmup=0)
    base = s.snapshot(label="bench base", pin=True)

    step_ms = _median(timed_ms(lambda: s.step(obs[history]), 5))  # estimate for the replay cutoff
    s.rollback(base.id)
    replay, eta_s = None, step_ms * history / 1e3
    if eta_s < plan.replay_limit_s:
        progress(f"history {history}: cold replay (~{eta_s:.0f} s)")
        replay = _median(timed_ms(s.cold_replay, 1, warmup=0))
        s.rollback(base.id)
    else:
        progress(f"history {history}: cold replay skipped (~{eta_s:.0f} s > {plan.replay_limit_s:.0f} s)")

    progress(f"history {history}: snapshot / restore / memcpy")
    row = s.live_row()
    with s.backend.activate():
        dst = s.backend.xp.empty_like(row)
        dst[...] = 1  # fault the pages in, as the store's records are
    s.backend.sync()
    snap, rest, mem, taken = [], [], [], []
    for _ in range(plan.snapshot_reps):  # interleaved so that all three see the same machine state
        snap += timed_ms(lambda: (taken.append(s.snapshot()), s.backend.sync()), 1, warmup=0)
        rest += timed_ms(lambda: (s.rollback(base.id), s.backend.sync()), 1, warmup=0)
        s.drop(taken.pop().id)  # no longer live after the rollback
        mem += timed_ms(lambda: (s.backend.copy(dst, row), s.backend.sync()), 1, warmup=0)

    progress(f"history {history}: rollback + 8-step re-plan")
    plan_obs = obs[None, history:history + 8]

    def rollback_replan():
        s.rollback(base.id)
        r = s.replan(base.id, plan_obs)
        s.drop(r.branch_capsule_ids[0])

    rr = _median(timed_ms(rollback_replan, 5))
    s.rollback(base.id)
    s.unpin(base.id)
    pf = _median(prefill)
    return {"history": history, "capsule_bytes": s.arena.row_nbytes,
            "full_row_capsule_bytes": full_row_capsule_bytes(s.cfg, s.arena.row_nbytes),
            "snapshot_ms": _median(snap), "restore_ms": _median(rest), "memcpy_ms": _median(mem),
            "memcpy_bytes": int(row.nbytes), "cold_replay_ms": replay, "cold_replay_estimate_s": round(eta_s, 1),
            "cold_prefill_ms": pf,
            "rollback_replan_ms": rr, "speedup_vs_prefill": round(pf / rr, 2), "speedup_vs": SPEEDUP_VS,
            "step_ms_at_full_window": step_ms, "budget_mb": s.cfg.capsule_budget_mb}


def default_point(s: Session, obs: np.ndarray, plan: Plan) -> tuple[dict, int]:
    """Step from reset past a full window: step latency, bytes per capsule, the KV-only ablation.
    Returns the results and how many observations were used."""
    W = s.cfg.kv_window
    fill = -(-(W + PAST_FULL) // KV_PAGE) * KV_PAGE  # a page boundary past a full window
    progress(f"default config (kv_window {W}): {fill} steps from reset")
    lat = [s.step(o).latency_ms for o in obs[:fill]]
    progress(f"default config: bytes per capsule over {plan.bytes_steps} steps")
    per_step = capsule_bytes_per_step(s, obs[fill:fill + plan.bytes_steps])
    at = fill + plan.bytes_steps

    progress("default config: KV-only ablation vs full restore")
    base = s.pin(s.live_capsule_id).id
    reference = np.stack([s.step(o).action for o in obs[at:at + 16]])
    for o in obs[at + 16:at + 200]:
        s.step(o)
    s.restore_roles(base, ("kv", "meta"))
    kv_only = np.stack([s.step(o).action for o in obs[at:at + 16]])
    s.rollback(base)
    full = np.stack([s.step(o).action for o in obs[at:at + 16]])
    s.unpin(base)
    out = {"step_latency_ms": p50_p99(lat[W // 4:]), "step_latency_note": "after the first quarter window",
           "capsule_bytes_per_step": per_step,
           "kv_only_max_abs_diff": float(np.abs(kv_only - reference).max()),
           "full_restore_max_abs_diff": float(np.abs(full - reference).max())}
    return out, at + 16


def full_window_points(s: Session, obs: np.ndarray, plan: Plan, out: dict) -> None:
    """Window full and wrapped: per-step capsule overhead and replan shared vs copy_fork vs after idle."""
    W = s.cfg.kv_window
    if W in plan.overhead_windows:
        progress(f"kv_window {W}: step with vs without a capsule, {plan.overhead_pairs} pairs A/B")
        out["step_capsule_overhead"][f"kv_window_{W}"] = step_capsule_overhead(s, obs[:2 * plan.overhead_pairs])
    for b, h, w in plan.replan_cases:
        if w == W:
            progress(f"kv_window {W}: replan {b}x{h}, shared vs copy_fork vs after {plan.replan_idle_s * 1e3:.0f} ms "
                     f"idle, {plan.replan_reps} reps each, interleaved")
            r = replan_ab(s, b, h, obs[2 * plan.overhead_pairs:], plan.replan_reps, idle_s=plan.replan_idle_s)
            out["replan_ms"][r["case"]] = r["shared"]
            if "after_idle" in r:
                out["replan_after_idle_ms"][r["case"]] = r["after_idle"]
            out["copy_fork_replan_ms"][r["case"]] = r["copy_fork"]
            out["copy_fork_over_shared"][r["case"]] = r["copy_fork_over_shared"]
            if "split" in r:  # the same replans on replan_threads threads (cpu), same run
                out.setdefault("replan_split_ms", {})[r["case"]] = r["split"]
            out["replan_detail"][r["case"]] = {k: r[k] for k in ("kv_window", "kv_len", "kv_fill", "step", "reps")}


def weight_bytes_read(s: Session) -> int:
    """The weight bytes one step reads: the slab's, less half of each matrix the compiled CPU step holds at 16
    bits (cpu_panels.py; other backends build no panels, so nothing is saved)."""
    from ...runtime.engine.cpu_panels import bytes_saved
    return int(s.arena.weight_slab.nbytes) - bytes_saved(s.arena)


def window_run(cfg: PolicyConfig, backend: str, W: int, plan: Plan, out: dict) -> None:
    needs_full = W in plan.overhead_windows or any(w == W for _, _, w in plan.replan_cases)
    budget = cfg.capsule_budget_mb
    if W != plan.default_window and not needs_full and plan.history_budget_mb:
        budget = plan.history_budget_mb  # history keys only: a smaller store starts faster, costs the same per op
    s = Session(cfg.replace(kv_window=W, capsule_budget_mb=budget), backend)
    out["backend"] = s.backend.name
    out["model"]["weight_bytes"] = int(s.arena.weight_slab.nbytes)
    out["model"]["weight_bytes_read"] = weight_bytes_read(s)
    obs = synthetic_trace(2 * W + 4096, cfg.obs_dim, seed=W)
    at = 0
    if W == plan.default_window:
        point, at = default_point(s, obs, plan)
        out.update(point)
    if W in plan.histories:
        if W == plan.default_window:  # history point resets the session: run the full-window keys first
            full_window_points(s, obs[at:], plan, out)
            needs_full = False
        out["histories"].append(history_point(s, obs, plan))
        at = W
    if needs_full:
        if live_kv_len(s) < W:
            progress(f"kv_window {W}: filling the window by cold prefill")
            s.prefill_from(obs[:W])
            at = W
        for o in obs[at:at + PAST_FULL]:
            s.step(o)
        full_window_points(s, obs[at + PAST_FULL:], plan, out)


def acceptance(out: dict, plan: Plan) -> dict:
    """The issue's targets next to what this run measured (reported, never adjusted)."""
    res = {}

    def check(key, value, at_most=None, at_least=None):
        ok = None if value is None else ((at_most is None or value <= at_most)
                                         and (at_least is None or value >= at_least))
        res[key] = {"value": value, "target": f"<= {at_most}" if at_most is not None else f">= {at_least}", "met": ok}

    check("capsule_bytes_per_step", out["capsule_bytes_per_step"]["measured"], 16 * 1024)
    for w in plan.depth_windows:
        check(f"rollback_depth_s.kv_window_{w}", out["rollback_depth_s"][f"kv_window_{w}"], at_least=60)
    for key, o in out["step_capsule_overhead"].items():
        check(f"step_capsule_overhead.{key}", o["overhead"], 0.05)
    check("step_latency_ms.p50", out["step_latency_ms"]["p50"], 0.35)
    for h in out["histories"]:  # issue 47: a restore (a small copy and a page table) under 5% of a default step
        check(f"restore_over_step.history_{h['history']}", round(h["restore_ms"] / out["step_latency_ms"]["p50"], 4),
              0.05)
    # issue 17's: 4x8 at the default window p50 <= 5 / p99 <= 8, 8x8 there p99 <= 12, 4x8 at 4x it p99 <= 15
    for i, (b, h, w) in enumerate(plan.replan_cases):
        case = f"{b}x{h}@{w}"
        r = out["replan_ms"][case]
        if i == 0:
            check(f"replan_ms.{case}.p50", r["p50"], 5)
            check(f"replan_ms.{case}.p99", r["p99"], 8)
        else:
            check(f"replan_ms.{case}.p99", r["p99"], 12 if i == 1 else 15)
        check(f"replan_floor.{case}.p50_over_floor", out["replan_floor"][case]["p50_over_floor"], 2)
    check("full_restore_max_abs_diff", out["full_restore_max_abs_diff"], 0.0)
    res["quick_run_sizes_differ"] = plan.quick
    return res


def run(args) -> dict:
    t0 = time.perf_counter()
    given = PolicyConfig.from_yaml(args.config) if args.config else PolicyConfig()
    histories = tuple(int(h) for h in (args.histories or "").split(",") if h)
    plan = Plan.quick_(histories) if getattr(args, "quick", False) else Plan.full(histories)
    cfg = given.replace(kv_window=plan.default_window,
                        capsule_budget_mb=QUICK_BUDGET_MB if plan.quick else given.capsule_budget_mb)
    out = {"backend": None, "quick": plan.quick, "speedup_vs": SPEEDUP_VS, "copy_fork_over_shared_vs": COPY_FORK_VS,
           "model": {k: getattr(cfg, k) for k in ("d_model", "n_layers", "n_heads", "max_branches",
                                                   "capsule_budget_mb", "capsule_every_n_steps")},
           "step_capsule_overhead": {}, "replan_ms": {}, "copy_fork_replan_ms": {}, "copy_fork_over_shared": {},
           "replan_after_idle_vs": AFTER_IDLE_VS, "replan_after_idle_ms": {}, "replan_detail": {}, "histories": []}
    windows = sorted({plan.default_window, *plan.histories, *plan.overhead_windows,
                      *(w for _, _, w in plan.replan_cases)})
    for W in windows:
        window_run(cfg, args.backend, W, plan, out)
        gc.collect()  # one session's memory at a time
    out["histories"].sort(key=lambda h: h["history"])
    out["rollback_depth_s"] = rollback_depth_formula(given, plan.depth_windows)  # the configured budget
    trace = lambda n: synthetic_trace(n, cfg.obs_dim, seed=7)  # noqa: E731
    out["rollback_depth_s"]["verified"] = verify_rollback_depth(cfg, args.backend, plan.depth_check_steps, trace)
    out["rollback_depth_s"]["verified_log_bound"] = verify_rollback_depth(cfg, args.backend, plan.depth_check_steps,
                                                                          trace, bound="log")
    out["core_peaks"] = core_peaks()
    out["replan_floor"] = {}
    for case, r in out["replan_ms"].items():
        b, h = (int(v) for v in case.split("@")[0].split("x"))
        floor = replan_floor(b, h, out["replan_detail"][case]["kv_len"], cfg.d_model, cfg.n_layers,
                             out["model"]["weight_bytes"], out["core_peaks"], out["model"]["weight_bytes_read"])
        out["replan_floor"][case] = {**floor, "p50_over_floor": round(r["p50"] / floor["floor_ms"], 2)}
    out["acceptance"] = acceptance(out, plan)
    out["wall_s"] = round(time.perf_counter() - t0, 1)
    return out

