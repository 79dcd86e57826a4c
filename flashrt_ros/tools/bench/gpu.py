"""`flashrt-bench gpu`: the capsule store on a CUDA device, side by side with its baselines.

Per attention window, on the default config, with the window full and wrapped: the snapshot's device
copy of the small record vs a raw device-to-device copy of the same bytes (GPU time from CUDA events
on the runtime stream), snapshot/restore as the API does them (wall clock, synchronised), the
per-step cost of a capsule and replan shared vs copy_fork (A/B interleaved, bench_measure), bytes per
capsule, and CUDA graph replay vs eager per-op launches of the live step.

The measurement code is backend-agnostic (wall clock where there is no CUDA stream), so its CPU-side
logic runs in the tests at toy sizes; `run` itself refuses to start without a usable device.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from ...runtime import PolicyConfig, Session
from ...runtime.model.kernels import KV_PAGE, window_pages
from ...runtime.state.sizing import StoreSizes
from ..common import progress, synthetic_trace
from .measure import (
    capsule_bytes_per_step,
    live_kv_len,
    replan_ab,
    rollback_depth_formula,
    stats_ms,
    step_capsule_overhead,
)


@dataclass(frozen=True)
class GpuPlan:
    windows: tuple[int, ...] = (1024, 4096, 16384)
    overhead_windows: tuple[int, ...] = (1024, 16384)
    replan_cases: tuple[tuple[int, int, int], ...] = ((4, 8, 1024), (8, 8, 1024), (4, 8, 4096), (4, 8, 16384))
    copy_reps: int = 200
    api_reps: int = 50
    graph_reps: int = 500
    overhead_pairs: int = 200
    replan_reps: int = 40
    bytes_steps: int = 4 * KV_PAGE

    @classmethod
    def tiny(cls) -> GpuPlan:
        """Toy sizes for the tests (any backend)."""
        return cls((128,), (128,), ((4, 4, 128),), 5, 5, 5, 8, 2, KV_PAGE)


def device_ms(s: Session, fn, reps: int) -> float:
    """Time per call of `reps` back-to-back calls: CUDA events on the runtime stream (GPU time) on the
    CUDA backend, wall clock around a synchronised loop elsewhere."""
    for _ in range(3):
        fn()
    if s.backend.name != "cuda":
        s.backend.sync()
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        s.backend.sync()
        return (time.perf_counter() - t0) * 1e3 / reps
    cp, st = s.backend.xp, s.backend.stream
    a, b = cp.cuda.Event(), cp.cuda.Event()
    a.record(st)
    for _ in range(reps):
        fn()
    b.record(st)
    b.synchronize()
    return cp.cuda.get_elapsed_time(a, b) / reps


def wall_ms(s: Session, fn) -> float:
    t0 = time.perf_counter()
    fn()
    s.backend.sync()
    return (time.perf_counter() - t0) * 1e3


def copies(s: Session, plan: GpuPlan) -> dict:
    """The snapshot's own copy (backend.copy: one memcpyAsync of the small record) vs a raw device copy
    of the same bytes (an elementwise array copy), and snapshot/restore through the Session API."""
    row = s.live_row()
    nbytes = int(s.arena.row_nbytes)
    dst = s.backend.zeros((nbytes,), np.uint8)  # a record-sized destination, outside the store

    def raw_copy():
        with s.backend.activate():
            dst[...] = row

    snap_dev = device_ms(s, lambda: s.backend.copy(dst, row), plan.copy_reps)
    raw = device_ms(s, raw_copy, plan.copy_reps)
    base = s.pin(s.live_capsule_id).id
    api_snap, api_restore, taken = [], [], []
    for _ in range(plan.api_reps):  # interleaved: the same machine state for both
        api_snap.append(wall_ms(s, lambda: taken.append(s.snapshot())))
        api_restore.append(wall_ms(s, lambda: s.rollback(base)))
        s.drop(taken.pop().id)  # no longer live after the rollback
    s.unpin(base)
    mb = nbytes / 1e6
    return {"capsule_bytes": nbytes, "snapshot_copy_ms": round(snap_dev, 5), "raw_copy_ms": round(raw, 5),
            "snapshot_copy_GBps": round(mb / snap_dev, 2) if snap_dev else None,
            "raw_copy_GBps": round(mb / raw, 2) if raw else None, "raw_over_snapshot_copy": round(raw / snap_dev, 3),
            "snapshot_ms": stats_ms(api_snap), "restore_ms": stats_ms(api_restore)}


def graph_vs_eager(s: Session, plan: GpuPlan) -> dict:
    """Back-to-back replays of the live step. Positions advance without the host's page bookkeeping,
    so this overwrites old log pages: it runs last and the session is discarded after."""
    runner = s._live  # the bound live step: graph replay, and eager launches where the backend has them
    graph = device_ms(s, runner.replay, plan.graph_reps)
    eager = device_ms(s, runner.replay_eager, plan.graph_reps) if hasattr(runner, "replay_eager") else None
    return {"graph_step_ms": round(graph, 5), "eager_step_ms": None if eager is None else round(eager, 5),
            "graph_speedup_vs_eager": None if eager is None else round(eager / graph, 2),
            "graph_speedup_vs": "eager per-op launches of the same live step, same device"}


def copy_fork_budget_mb(cfg: PolicyConfig, plan: GpuPlan) -> float:
    """The configured budget, doubled until the copy_fork arm fits: it copies the whole window into each
    branch's private pages (4 x 16384 needs ~520 pages; the default 512 MB holds 471 there)."""
    W, budget = cfg.kv_window, cfg.capsule_budget_mb
    branches = max((b for b, _, w in plan.replan_cases if w == W), default=0)
    need = (branches + 2) * (window_pages(W) + 2) + 2 * cfg.max_branches  # branches' copies, live window, base
    while StoreSizes.plan(cfg.replace(capsule_budget_mb=budget)).log_pages < need:
        budget *= 2
    return budget


def point(cfg: PolicyConfig, backend, plan: GpuPlan) -> dict:
    cfg = cfg.replace(capsule_budget_mb=copy_fork_budget_mb(cfg, plan))
    W = cfg.kv_window
    s = Session(cfg, backend)
    fill = -(-(W + 64) // KV_PAGE) * KV_PAGE  # a full, wrapped window, ending on a page boundary
    obs = synthetic_trace(fill + plan.bytes_steps + 2 * plan.overhead_pairs + 64, cfg.obs_dim, seed=W)
    progress(f"kv_window {W}: {fill} steps to fill the window")
    lat = [s.step(o).latency_ms for o in obs[:fill]]
    out = {"kv_window": W, "budget_mb": cfg.capsule_budget_mb, "kv_len": live_kv_len(s),
           "step_latency_ms": stats_ms(lat[len(lat) // 2:])}
    out["capsule_bytes_per_step"] = capsule_bytes_per_step(s, obs[fill:fill + plan.bytes_steps])
    rest = obs[fill + plan.bytes_steps:]
    progress(f"kv_window {W}: snapshot copy vs raw copy, snapshot/restore")
    out["copies"] = copies(s, plan)
    if W in plan.overhead_windows:
        progress(f"kv_window {W}: step with vs without a capsule, A/B")
        out["step_capsule_overhead"] = step_capsule_overhead(s, rest[:2 * plan.overhead_pairs])
    out["replan"] = {}
    for b, h, w in plan.replan_cases:
        if w == W:
            progress(f"kv_window {W}: replan {b}x{h} shared vs copy_fork, A/B")
            r = replan_ab(s, b, h, rest[2 * plan.overhead_pairs:], plan.replan_reps)
            out["replan"][r["case"]] = r
    progress(f"kv_window {W}: graph replay vs eager launches")
    out.update(graph_vs_eager(s, plan))
    return out


def run(args) -> dict:
    from ...runtime.engine.backend import cuda_probe

    why_not = cuda_probe()
    if why_not:
        raise SystemExit(f"flashrt-bench gpu: no usable CUDA device: {why_not}")
    import cupy

    dev = cupy.cuda.Device()
    props = cupy.cuda.runtime.getDeviceProperties(dev.id)
    cfg = PolicyConfig.from_yaml(args.config) if getattr(args, "config", None) else PolicyConfig()
    plan = GpuPlan()
    points = [point(cfg.replace(kv_window=w), "cuda", plan) for w in plan.windows]
    return {"device": props["name"].decode() if isinstance(props["name"], bytes) else props["name"],
            "compute_capability": dev.compute_capability, "cupy": cupy.__version__, "points": points,
            "copy_fork_over_shared_vs": "shared-window replan of the same case, same run, same device",
            **summary(points), "rollback_depth_s": rollback_depth_formula(cfg, (1024, 16384))}


def summary(points: list[dict]) -> dict:
    """The runtime bench's top-level keys, gathered from the per-window points."""
    out = {"replan_ms": {}, "copy_fork_replan_ms": {}, "copy_fork_over_shared": {}, "step_capsule_overhead": {}}
    for p in points:
        for case, r in p["replan"].items():
            out["replan_ms"][case] = r["shared"]
            out["copy_fork_replan_ms"][case] = r["copy_fork"]
            out["copy_fork_over_shared"][case] = r["copy_fork_over_shared"]
        if "step_capsule_overhead" in p:
            out["step_capsule_overhead"][f"kv_window_{p['kv_window']}"] = p["step_capsule_overhead"]
    out["capsule_bytes_per_step"] = points[0]["capsule_bytes_per_step"] if points else None
    return out
