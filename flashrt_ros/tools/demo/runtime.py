"""The runtime demo, no ROS: step a synthetic sensor trace, roll back, re-plan, prove byte-exactness."""
from __future__ import annotations

import hashlib

import numpy as np

from ...runtime import PolicyConfig, Session
from ..common import p50_p99, progress, synthetic_trace


def _sha(a: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()[:12]


MIN_STEPS = 2


def rollback_depth(steps: int) -> int:
    """50 steps back, or half the trace when it is shorter: the target must be a step that was taken."""
    return min(50, steps // 2)


def run(args) -> dict:
    cfg = PolicyConfig.from_yaml(args.config) if args.config else PolicyConfig()
    n = args.steps
    if n < MIN_STEPS:
        raise ValueError(f"--steps must be at least {MIN_STEPS} (a rollback needs a step to go back to), got {n}")
    back = rollback_depth(n)
    s = Session(cfg, args.backend)
    cfg = s.cfg  # policy_path: the file's architecture
    obs = synthetic_trace(n + 64, cfg.obs_dim)
    progress(f"backend {s.backend.name}: stepping {n} observations, a capsule after each")
    results = [s.step(o) for o in obs[:n]]
    actions = np.stack([r.action for r in results])

    progress(f"rolling back {back} steps")
    info = s.rollback(steps_back=back)
    s.store.pin(info.id)
    start = info.step  # n - back, or the newest capsule before it when capsule_every_n_steps > 1
    replayed = np.stack([s.step(o).action for o in obs[start:n]])
    byte_exact = replayed.tobytes() == actions[start:].tobytes()

    progress("re-planning 4 branches x 8 steps from the rollback capsule (what-if)")
    live_before = s.state_host()
    rng = np.random.default_rng(1)
    branches = obs[None, start:start + 8] + 0.2 * rng.standard_normal((4, 8, cfg.obs_dim))
    plan = s.replan(info.id, branches.astype(np.float32), deadline_ms=50.0)
    whatif_untouched = s.state_host().tobytes() == live_before.tobytes()
    s.rollback(info.id)
    # Over the steps the replan did: a deadline can cut it short on a loaded machine.
    branch0_live = np.stack([s.step(o).action for o in branches[0, :plan.steps_done].astype(np.float32)])
    batch_invariant = branch0_live.tobytes() == plan.actions[0].tobytes()

    progress("KV-only restore (the ablation) vs full restore")
    s.rollback(info.id)
    reference = np.stack([s.step(o).action for o in obs[start:start + 16]])
    s.restore_roles(info.id, ("kv", "meta"))
    kv_only = np.stack([s.step(o).action for o in obs[start:start + 16]])
    s.rollback(info.id)
    full = np.stack([s.step(o).action for o in obs[start:start + 16]])

    summary = {
        "backend": s.backend.name, "steps": n, "state_bytes_per_capsule": s.arena.row_nbytes,
        "step_latency_ms": p50_p99([r.latency_ms for r in results]),
        "rollback_capsule": {"id": info.id, "step": info.step},
        "replay_byte_exact": byte_exact, "replay_actions_sha256": _sha(replayed),
        "replan": {"branches": 4, "horizon": 8, "steps_done": plan.steps_done, "elapsed_ms": round(plan.elapsed_ms, 3),
                   "deadline_met": plan.deadline_met, "whatif_left_live_untouched": whatif_untouched,
                   "branch0_equals_live_stepping": batch_invariant},
        "kv_only_max_abs_diff": float(np.abs(kv_only - reference).max()),
        "full_restore_max_abs_diff": float(np.abs(full - reference).max()),
    }
    if getattr(args, "plot", None):  # per-step data for the figure, only when asked (it grows with --steps)
        summary["samples"] = {"step_latency_ms": [round(r.latency_ms, 4) for r in results],
                              "action0": actions[:, 0].tolist(), "replayed_action0": replayed[:, 0].tolist(),
                              "replan_start_step": start, "replan_action0": plan.actions[:, :, 0].tolist()}
    _print_table(summary)
    # Correctness only: a missed deadline is reported above (machine speed), not a failure.
    summary["ok"] = bool(byte_exact and whatif_untouched and batch_invariant
                         and summary["full_restore_max_abs_diff"] == 0.0 and summary["kv_only_max_abs_diff"] > 1e-3)
    return summary


def _print_table(s: dict) -> None:
    def yes(b):
        return "yes" if b else "NO"
    rows = [
        ("backend", s["backend"]),
        ("steps (capsule after each)", f"{s['steps']}, {s['state_bytes_per_capsule'] / 2**20:.2f} MiB each"),
        ("step latency p50 / p99", f"{s['step_latency_ms']['p50']:.3f} / {s['step_latency_ms']['p99']:.3f} ms"),
        ("rolled back to", f"capsule {s['rollback_capsule']['id']} (step {s['rollback_capsule']['step']})"),
        ("replay from capsule byte-exact", yes(s["replay_byte_exact"])),
        ("replan 4 x 8 (what-if)", f"{s['replan']['elapsed_ms']:.2f} ms, deadline met: "
                                   f"{yes(s['replan']['deadline_met'])} ({s['replan']['steps_done']}/8 steps)"),
        ("  live state untouched", yes(s["replan"]["whatif_left_live_untouched"])),
        ("  branch 0 == live stepping (bytes)", yes(s["replan"]["branch0_equals_live_stepping"])),
        ("full restore max |diff|", f"{s['full_restore_max_abs_diff']:.3g}"),
        ("KV-only restore max |diff|", f"{s['kv_only_max_abs_diff']:.3g}  (diverges: KV alone is not the state)"),
    ]
    w = max(len(r[0]) for r in rows)
    print("\nflashrt runtime demo")
    print("-" * (w + 40))
    for k, v in rows:
        print(f"{k.ljust(w)}  {v}")
    print("-" * (w + 40))
