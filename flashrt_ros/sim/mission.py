"""The task figures of issue 46, offline (a Session and the world in one process, no ROS graph), over the same
seeded held-out episodes: the expert's and the policy's success, the three fault conditions (no faults; faults,
no correction; faults with rollback correction) with their tracking error, the correction replans' times and
byte-exact checks, and what-if selection under a biased object estimate, with and without. `flashrt-bench task`
prints this dict as JSON.
"""
from __future__ import annotations

import hashlib
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path

import numpy as np

from .correction import REPLAN_BUDGET_MS, run_fault_episode, tracking_error
from .evaluate import policy_session, run_policy_episode
from .expert import PusherExpert, run_episode
from .faults import FaultConfig, draw_faults
from .whatif import WhatIfConfig, run_biased_episode
from .world import CONTROL_HZ, PusherWorld

HELD_OUT_SEED_BASE = 2 ** 32  # record.HELD_OUT_SEED_BASE: recordings use seeds below it
SHIPPED_POLICY = Path(__file__).resolve().parents[2] / "config" / "policies" / "pusher.safetensors"
# rollback depth for the longest correction (30 stale steps + 20 of delay) and room for the what-ifs' branches
MISSION_CAPSULE_BUDGET_MB = 8.0
TRACKING_DEFINITION = ("mean over every step of the episode of the distance from the no-fault run of the same "
                       "seed: the arm's 7 joint positions (rad, Euclidean) and the hand's position (m)")


def _rate(flags) -> float:
    flags = list(flags)
    return round(sum(flags) / len(flags), 4) if flags else 0.0


def _checks(flags) -> dict:
    flags = list(flags)
    return {"passed": int(sum(flags)), "total": len(flags)}


def run_mission(policy_path: str | Path = SHIPPED_POLICY, episodes: int = 10, first_seed: int = HELD_OUT_SEED_BASE,
                seconds: float = 10.0, backend: str = "cpu", faults: FaultConfig | None = None,
                what_ifs: WhatIfConfig | None = None, progress=None) -> dict:
    """Every figure over seeds first_seed .. first_seed + episodes - 1. `progress(str)` hears each part."""
    t0 = time.perf_counter()
    wc = what_ifs or WhatIfConfig()
    seeds = list(range(first_seed, first_seed + episodes))
    steps = int(round(seconds * CONTROL_HZ))
    say = progress or (lambda _: None)
    world, twin = PusherWorld(), PusherWorld()
    expert = PusherExpert(world)
    session = policy_session(str(policy_path), backend, max_branches=wc.hypotheses,
                             capsule_budget_mb=MISSION_CAPSULE_BUDGET_MB)
    reference = policy_session(str(policy_path), backend, capsule_budget_mb=MISSION_CAPSULE_BUDGET_MB)

    say("expert and policy")
    expert_ok = [run_episode(world, expert, s, seconds) for s in seeds]
    policy_ok = [run_policy_episode(world, session, s, seconds).success for s in seeds]

    say("faults: none, uncorrected, corrected")
    runs = {"no_fault": [], "uncorrected": [], "corrected": []}
    kinds: Counter = Counter()
    for s in seeds:
        drawn = draw_faults(s, steps, faults)
        kinds.update(f.kind for f in drawn)
        runs["no_fault"].append(run_fault_episode(world, session, s, [], False, seconds))
        runs["uncorrected"].append(run_fault_episode(world, session, s, drawn, False, seconds))
        runs["corrected"].append(run_fault_episode(world, session, s, drawn, True, seconds, reference=reference))
    tracking = {}
    for name, episodes_of in runs.items():
        errors = np.array([tracking_error(r, c) for r, c in zip(episodes_of, runs["no_fault"])])
        tracking[name] = {"joint_rad": round(float(errors[:, 0].mean()), 4),
                          "hand_m": round(float(errors[:, 1].mean()), 4)}
    replan_ms = [ms for r in runs["corrected"] for ms in r.replan_ms]
    correction_exact = [ok for r in runs["corrected"] for ok in r.byte_exact]

    say("what-if selection under a biased object estimate")
    without = [run_biased_episode(world, twin, session, s, False, seconds, wc) for s in seeds]
    with_selection = [run_biased_episode(world, twin, session, s, True, seconds, wc) for s in seeds]
    kept_estimate = [run_biased_episode(world, twin, session, s, True, seconds, replace(wc, adopt=False)).success
                     for s in seeds]
    tried = [w for e in with_selection for w in e.what_ifs]
    whatif_exact = [ok for e in with_selection for ok in e.byte_exact]
    residual = [float(np.linalg.norm(e.bias + e.final_offset)) for e in with_selection]

    return {
        "mode": "offline",
        "offline": "a Session and the MuJoCo world in one process, no ROS graph: no ROS figure is claimed here",
        "policy": str(policy_path),
        "policy_sha256": hashlib.sha256(Path(policy_path).read_bytes()).hexdigest(),
        "backend": session.backend.name,
        "episodes": episodes,
        "seeds": {"first": first_seed, "count": episodes, "held_out_base": HELD_OUT_SEED_BASE},
        "seconds_per_episode": seconds,
        "expert_success": _rate(expert_ok),
        "policy_success": _rate(policy_ok),
        "no_fault_success": _rate(r.success for r in runs["no_fault"]),
        "uncorrected_success": _rate(r.success for r in runs["uncorrected"]),
        "corrected_success": _rate(r.success for r in runs["corrected"]),
        "tracking_error": {**tracking, "definition": TRACKING_DEFINITION},
        "faults": {"total": sum(kinds.values()), "by_kind": dict(sorted(kinds.items()))},
        "replans": len(replan_ms),
        "replan_p50_ms": round(float(np.percentile(replan_ms, 50)), 3) if replan_ms else None,
        "replan_p99_ms": round(float(np.percentile(replan_ms, 99)), 3) if replan_ms else None,
        "replan_max_ms": round(max(replan_ms), 3) if replan_ms else None,
        "replan_budget_ms": REPLAN_BUDGET_MS,
        "deadline_misses": sum(ms > REPLAN_BUDGET_MS for ms in replan_ms),
        "byte_exact_checks": {**_checks(correction_exact + whatif_exact),
                              "correction": _checks(correction_exact), "what_if": _checks(whatif_exact)},
        "whatif_selection_success": {"with": _rate(e.success for e in with_selection),
                                     "without": _rate(e.success for e in without)},
        "whatif": {"hypotheses": wc.hypotheses, "horizon_steps": wc.horizon, "every_steps": wc.every,
                   "tried": len(tried), "committed": sum(w.committed >= 0 for w in tried),
                   "replan_p99_ms": round(float(np.percentile([w.replan_ms for w in tried], 99)), 3) if tried else None,
                   "bias_m": round(float(np.mean([np.linalg.norm(e.bias) for e in with_selection])), 4),
                   "residual_bias_m": round(float(np.mean(residual)), 4),
                   "with_selection_estimate_kept_success": _rate(kept_estimate)},
        "elapsed_s": round(time.perf_counter() - t0, 1),
    }
