"""Replan: fork a capsule into B branches and step them as one batch (Session.replan).

Branches read the source capsule's KV window in place from the log and append to private pages; the
committed branch, if any, becomes the live timeline.

Locks: ``session.branch_lock`` for the whole replan (it owns rows 1..b meanwhile); ``session.lock`` only
for the bookkeeping (fork, page allocation and references, snapshots, history, commit; where the backend
replays rows concurrently, a batched step that appends in place to the branches' own pages takes none), released around
each batched step's compute and around the fork's copy-on-write of its partial pages where the backend can
replay rows concurrently (``concurrent_replay``). So a live step waits at most for one bookkeeping section,
never for a batched step (on CUDA it runs between two batched steps; the lock is not fair, so under load it
may wait for more than one).
"""
from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from .errors import NonFiniteAction
from .inputs import as_observations, check_int, check_real
from .model.kernels import KV_PAGE


@dataclass
class ReplanResult:
    actions: np.ndarray  # [branches, steps_done, action_dim] float32
    branch_capsule_ids: list[int]  # end state of each branch
    elapsed_ms: float
    deadline_met: bool
    steps_done: int
    horizon: int
    live_capsule_id: int
    message: str
    cancelled: bool = False  # a cancelled replan never commits



def run_replan(session, capsule_id: int | None, observations, commit_branch: int | None = None,
               deadline_ms: float | None = None, cancel: Callable[[], bool] | None = None,
               on_step: Callable[[int], None] | None = None, copy_fork: bool = False) -> ReplanResult:
    """Session.replan, which documents it."""
    t0 = time.perf_counter()
    arr = np.asarray(observations)
    if arr.ndim != 3:
        raise ValueError(f"observations: expected [branches, horizon, obs_dim], got shape {arr.shape}")
    b, h = arr.shape[:2]
    if not 1 <= b <= session.cfg.max_branches:
        raise ValueError(f"branches: must be 1..{session.cfg.max_branches} (max_branches), got {b}")
    if h < 1:
        raise ValueError("horizon: must be >= 1")
    obs = as_observations(arr, (b, h, session.cfg.obs_dim), "observations")
    capsule_id = check_int("capsule_id", capsule_id, none_ok=True)
    commit_branch = check_int("commit_branch", commit_branch, none_ok=True)
    deadline_ms = check_real("deadline_ms", deadline_ms, none_ok=True)
    if commit_branch is not None and not 0 <= commit_branch < b:
        raise ValueError(f"commit_branch: must be in 0..{b - 1}, got {commit_branch}")
    if deadline_ms is not None and not deadline_ms > 0:
        raise ValueError(f"deadline_ms: must be > 0 or None (no deadline), got {deadline_ms}")
    limit_ms = math.inf if deadline_ms is None else float(deadline_ms)
    # The branch rows compute outside the session lock where the backend allows it (concurrent_replay):
    # a live step (row 0, its own pages) then runs beside a batched step; elsewhere (CUDA: one stream,
    # bound graphs) between two of them. branch_lock keeps the operations that touch the branch rows or
    # the whole store (reset, resume) out until the rows are given back.
    concurrent = getattr(session.backend, "concurrent_replay", False)
    compute_lock = contextlib.nullcontext() if concurrent else session.lock
    # branch_lock, raising instead of deadlocking from a step's callback or re-entering from this replan's own
    with session._beside_no_replan(take_lock=False), session._replanning_here():
        try:
            with session.lock:  # one section: no live step takes the pages checked or evicts the source meanwhile
                if capsule_id:
                    src_info = session.store.get(capsule_id)
                    base_step, parent = src_info.step, capsule_id
                    base_node = session.history.node_of(capsule_id)
                else:
                    base_step, parent, base_node = session._step, session._live_id, session.history.head
                # fresh pages: a branch copies its partial page, then one per page boundary it crosses
                per_branch = (min(session.kv.P, (base_step % KV_PAGE + h) // KV_PAGE + 1)
                              + (session.kv.P if copy_fork else 0))
                session.store.check_room(b * per_branch + 1, f"a replan of {b} x {h}",
                                         keep=[session.store.pages_of(capsule_id)] if capsule_id else [])
                if capsule_id:  # fork: a small copy per branch, the window shared
                    session.store.restore(capsule_id, 1, b)
                else:
                    for r in range(1, 1 + b):
                        session.backend.copy(session.arena.state[r], session.live_row())
                    session.kv.set_row(1, session.kv.tables[0], b)
                if copy_fork:
                    for r in range(1, 1 + b):
                        session.kv.privatise_window(r, base_step)
                runner = session._branch_runner(b)
            obs_rows, act_rows = session.arena["obs"][1:1 + b], session.arena["action"][1:1 + b]
            actions = np.empty((b, h, session.cfg.action_dim), np.float32)
            done, message, cancelled = 0, "", False
            for t in range(h):
                # Most steps append in place to the branches' own pages: no lock, so the step does not wait for a
                # live step (with its publishes) to give the lock back, h times a replan. Page references and
                # fills shared with the live row (a copy-on-write, a page boundary) take it.
                if concurrent and session.kv.branch_appends_in_place(1, b, base_step + t):
                    session.backend.from_host(obs_rows, obs[:, t])  # rows 1..b: this replan's own
                    pending = None
                else:
                    with session.lock:
                        session.backend.from_host(obs_rows, obs[:, t])
                        pending = session.kv.prepare_branch_appends(1, b, base_step + t, defer_copies=concurrent)
                if pending is not None:  # the fork's copy-on-write off the lock (half of a fork's time in it)
                    copied = False
                    try:
                        session.kv.copy_pending(pending)
                        copied = True
                    finally:
                        with session.lock:
                            session.kv.finish_pending(pending, copied)
                # rows 1..b only: their own state and work, the window's pages (referenced by these rows, so
                # never freed or rewritten) and their private pages; weights are read-only
                with compute_lock:
                    runner.replay()
                    actions[:, t] = session.backend.to_host(act_rows)
                done += 1
                if on_step is not None:
                    on_step(done)
                if done < h and (time.perf_counter() - t0) * 1e3 > limit_ms:
                    message = f"deadline {limit_ms:.1f} ms passed after {done}/{h} steps; rest abandoned"
                    break
                if cancel is not None and cancel():
                    message, cancelled = f"cancelled after {done}/{h} steps; nothing committed", True
                    break
            if commit_branch is not None and not cancelled and not np.isfinite(actions[commit_branch, :done]).all():
                raise NonFiniteAction(f"replan refused: branch {commit_branch} produced a non-finite action, so it "
                                      "is not committed and the live state is untouched (its source state cannot "
                                      "come from a run of this policy: a forged or damaged capsule?)")
            with session.lock:
                ids = [session.store.snapshot(1 + r, step=base_step + done, parent_id=parent,
                                              label=f"replan branch {r}").id for r in range(b)]
                for r, cid in enumerate(ids):
                    session.history.mark(cid, session.history.branch(base_node, base_step, obs[r, :done]))
                committed = commit_branch is not None and not cancelled
                if committed:  # live steps taken meanwhile are left behind, as a rollback would
                    session.store.restore(ids[commit_branch], 0)
                    session._step = base_step + done
                    session._live_id = ids[commit_branch]
                    session.history.head = session.history.node_of(session._live_id)
                    for tap in session.record_taps():  # the committed branch is the timeline now
                        tap.on_capsule(session.store.get(session._live_id))
                # only now: while they were taken, a branch's capsule must not be evicted for its sibling's
                session.store.mark_what_if([c for r, c in enumerate(ids) if not (committed and r == commit_branch)])
                live_id = session._live_id
        finally:
            with session.lock:
                for left in list(session.kv.pending):  # an exception between a fork's sections: pages back
                    session.kv.finish_pending(left, copied=False)
                session.kv.clear_row(1, b)  # branch rows give their pages back
        session.backend.sync()
        elapsed = (time.perf_counter() - t0) * 1e3
        met = done == h and elapsed <= limit_ms
        if not message and not met:
            message = f"finished in {elapsed:.1f} ms, over the {limit_ms:.1f} ms deadline"
        return ReplanResult(actions[:, :done], ids, elapsed, met, done, h, live_id, message or "ok",
                            cancelled)
