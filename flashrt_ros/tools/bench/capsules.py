"""`flashrt-bench capsules`: a short mission on the runtime Session, in-process, whose capsule tree is
the result: steps, a pin, rollbacks (new branches of the timeline), a what-if replan and a committed
one, then enough steps that a small store evicts. Every capsule the store ever held is listed with its
parent, step, pin and whether it was evicted, plus the events in order: what `--plot` draws.
"""
from __future__ import annotations

import numpy as np

from ...runtime import PolicyConfig, Session
from ..common import progress, synthetic_trace

# A small model and store: the tree is the point here, not the speed. 96 records fill within the run.
CONFIG = dict(d_model=32, n_layers=2, n_heads=2, kv_window=32, chunk_len=4, max_branches=4,
              capsule_every_n_steps=1, capsule_capacity=96, capsule_budget_mb=8.0)
FINAL_STEPS = 70  # after the deep rollback; about 160 capsules in all, so about 65 are evicted


class LineageRecorder:
    """Every capsule seen in the store (the list after each operation), and which of them went
    without being dropped: those were evicted."""

    def __init__(self, s: Session):
        self.s = s
        self.capsules: dict[int, dict] = {}
        self.events: list[dict] = []
        self.dropped: set[int] = set()
        self.op = 0

    def observe(self) -> None:
        self.op += 1
        now = {c.id: c for c in self.s.list_capsules()}
        for cid, c in now.items():
            rec = self.capsules.setdefault(cid, {"id": cid, "parent_id": c.parent_id, "step": c.step,
                                                 "label": c.label, "pinned": False, "ever_pinned": False,
                                                 "evicted": False, "born_op": self.op, "gone_op": None})
            rec["pinned"] = c.pinned
            rec["ever_pinned"] |= c.pinned
        for cid, rec in self.capsules.items():
            if rec["gone_op"] is None and cid not in now:
                rec["gone_op"] = self.op
                rec["evicted"] = cid not in self.dropped

    def event(self, kind: str, **kw) -> None:
        self.observe()
        self.events.append({"kind": kind, "op": self.op, "live_capsule": self.s.live_capsule_id,
                            "live_step": self.s.step_count, **kw})

    def steps(self, obs) -> None:
        for o in obs:
            self.s.step(o)
            self.observe()


def run(args) -> dict:
    cfg = PolicyConfig(**CONFIG)
    s = Session(cfg, getattr(args, "backend", "numpy"))
    obs = synthetic_trace(256, cfg.obs_dim, seed=5)
    rec = LineageRecorder(s)
    progress(f"capsules: a short mission on a small store ({cfg.capsule_capacity} records), rollbacks, replans, a pin")
    rec.steps(obs[:40])
    anchor = s.list_capsules()[9]  # step 10: kept through every eviction below
    s.pin(anchor.id)
    rec.event("pin", capsule=anchor.id, step=anchor.step)

    back = s.rollback(steps_back=15)
    rec.event("rollback", to_capsule=back.id, to_step=back.step)
    rec.steps(obs[back.step:back.step + 20] + 0.05)  # a different future from the same past

    plan_obs = np.stack([obs[45:53] + 0.1 * b for b in range(3)]).astype(np.float32)
    r = s.replan(None, plan_obs)
    rec.event("replan", base_step=s.step_count, branch_capsules=list(r.branch_capsule_ids), committed=None)

    base = s.rollback(steps_back=10)
    rec.event("rollback", to_capsule=base.id, to_step=base.step)
    r = s.replan(base.id, plan_obs[:2], commit_branch=1)
    rec.event("replan", base_step=base.step, branch_capsules=list(r.branch_capsule_ids), committed=1)
    at = s.step_count
    rec.steps(obs[at:at + 25])

    back = s.rollback(anchor.id)  # deep: back to the pinned capsule
    rec.event("rollback", to_capsule=back.id, to_step=back.step)
    rec.steps(obs[back.step:back.step + FINAL_STEPS])  # past the store's records: the oldest unpinned go
    r = s.replan(None, plan_obs[:2])  # a what-if from the live state, still held at the end
    rec.event("replan", base_step=s.step_count, branch_capsules=list(r.branch_capsule_ids), committed=None)

    u = s.store_usage()
    caps = sorted(rec.capsules.values(), key=lambda c: c["id"])
    progress(f"capsules: {len(caps)} seen, {sum(c['evicted'] for c in caps)} evicted, {u.capsules} held")
    return {"config": CONFIG, "steps_taken": s.step_count, "live_capsule": s.live_capsule_id,
            "capsules_seen": len(caps), "evicted": sum(c["evicted"] for c in caps), "held": u.capsules,
            "pinned": u.pinned, "capacity": u.capacity, "rollback_depth_steps": u.rollback_depth_steps,
            "events": rec.events, "capsules": caps}
