"""The log-structured store against a full-copy oracle (DESIGN.md contract 4).

Random sequences of step runs, snapshot, rollback, replan, commit, fork, drop, pin, unpin and
export/import run on a store small enough that both its records and its KV log pages wrap. After every
operation, each restorable capsule must materialise (small state + window gathered from the log) to
exactly the bytes a full-copy store took at snapshot time, every pinned capsule must still be there,
and an evicted capsule must be refused cleanly with the live state untouched.
"""
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import observation_trace, small_config
from flashrt_ros.runtime import CapsuleError, CapsuleInUse, Session, StoreFullOfPins, UnknownCapsule
from flashrt_ros.runtime.sizing import StoreSizes

OPS = ["run", "run", "snapshot", "rollback", "replan", "commit", "fork", "drop", "pin", "unpin", "export_import"]


def wrapping_config(records: int = 200, log_pages: int = 16, **kw):
    """A window of 150 (3 page-table slots) and a budget of exactly `records` records and `log_pages` pages."""
    base = small_config(kv_window=150, max_branches=3, capsule_every_n_steps=10, capsule_capacity=records, **kw)
    sz = StoreSizes.plan(base)
    page = sz.entry_nbytes * 128
    return base.replace(capsule_budget_mb=(records * sz.record_nbytes + log_pages * page) / 2**20)


def test_the_log_wrap_evicts_the_oldest_capsules_before_the_records_run_out():
    s = Session(wrapping_config())
    assert (s.store.capacity, s.kv.n_pages) == (200, 16)
    for o in observation_trace(2500):
        s.step(o)
    u = s.store_usage()
    steps = [c.step for c in s.list_capsules()]
    assert u.capsules < 190 and steps == sorted(steps) and steps[-1] == 2500  # pages ran out first, oldest went
    assert u.log_entries_used <= 16 * 128 and u.rollback_depth_steps > 16 * 128 - 4 * 128 - 150


def test_the_record_ring_evicts_oldest_first_when_records_run_out():
    s = Session(wrapping_config(records=12, log_pages=64))
    for o in observation_trace(400):
        s.step(o)
    assert [c.step for c in s.list_capsules()] == list(range(290, 401, 10))


def _unchanged_refusal(s, fn, exc=CapsuleError):
    before, live, step = s.state_host().tobytes(), s.live_capsule_id, s.step_count
    with pytest.raises(exc):
        fn()
    assert (s.state_host().tobytes(), s.live_capsule_id, s.step_count) == (before, live, step)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=st.lists(st.tuples(st.sampled_from(OPS), st.integers(0, 10**6)), min_size=5, max_size=35))
def test_every_restorable_capsule_materialises_to_the_full_copy_oracle(ops, tmp_path):
    s = Session(wrapping_config())
    obs = observation_trace(4000, seed=9)
    cursor = 0
    oracle: dict[int, bytes] = {}  # capsule id -> full state bytes when it was taken
    pinned: set[int] = set()
    dropped: set[int] = set()

    def take(n):
        nonlocal cursor
        out = obs[cursor % 3000:cursor % 3000 + n]
        cursor += n
        return out

    for op, r in ops:
        known = sorted(oracle)
        pick = known[r % len(known)] if known else 10**6
        alive = pick in s.store
        if op == "run":
            for o in take(1 + r % 260):  # the live step never fails, whatever is pinned
                res = s.step(o)
                if res.capsule_id:
                    oracle[res.capsule_id] = s.state_host().tobytes()
        elif op == "snapshot":
            try:
                info = s.snapshot(pin=r % 2 == 0)
            except StoreFullOfPins:
                continue
            oracle[info.id] = s.state_host().tobytes()
            pinned |= {info.id} if info.pinned else set()
        elif op == "rollback":
            if alive:
                s.rollback(pick)
                assert s.state_host().tobytes() == oracle[pick], "restore is byte-exact"
            else:
                _unchanged_refusal(s, lambda p=pick: s.rollback(p), UnknownCapsule)
        elif op in ("replan", "commit"):
            b, h = 1 + r % 3, 1 + r % 140  # horizons past a page boundary
            src = pick if alive and r % 3 else 0
            res = s.replan(src, take(b * h).reshape(b, h, -1), commit_branch=0 if op == "commit" else None)
            for cid in res.branch_capsule_ids:
                oracle[cid] = s.capsule_host(cid).tobytes()
            if op == "commit":
                assert s.state_host().tobytes() == oracle[res.branch_capsule_ids[0]]
        elif op == "fork":
            if alive:
                oracle[s.store.fork(pick).id] = oracle[pick]
        elif op == "drop":
            if pick == s.live_capsule_id:
                _unchanged_refusal(s, lambda p=pick: s.drop(p), CapsuleInUse)
            elif alive:
                s.drop(pick)
                dropped.add(pick)
                pinned.discard(pick)
        elif op in ("pin", "unpin") and alive:
            try:
                (s.pin if op == "pin" else s.unpin)(pick)
            except StoreFullOfPins:
                continue
            pinned = pinned | {pick} if op == "pin" else pinned - {pick}
        elif op == "export_import" and alive:
            s.export_capsule(pick, tmp_path / "c.safetensors")
            oracle[s.import_capsule(tmp_path / "c.safetensors").id] = oracle[pick]

        listed = {c.id for c in s.list_capsules()}
        assert listed <= set(oracle), "the store holds only capsules it reported"
        assert pinned <= listed, "a pin never loses its capsule"
        assert not listed & dropped
        for cid in listed:
            assert s.capsule_host(cid).tobytes() == oracle[cid], f"capsule {cid} drifted from its oracle bytes"
        evicted = sorted(set(oracle) - listed - dropped)
        if evicted:
            gone = evicted[r % len(evicted)]
            with pytest.raises(UnknownCapsule, match="evicted"):
                s.materialize(gone)


def test_what_if_branches_are_evicted_before_the_timeline_loses_depth():
    s = Session(wrapping_config())
    obs = observation_trace(3000)
    for k, o in enumerate(obs):
        s.step(o)
        if k % 25 == 24:  # a 3 x 8 what-if every 25 steps: each branch copies a partial page
            s.replan(0, np.stack([obs[k:k + 8]] * 3))
    caps = s.list_capsules()
    timeline = [c.step for c in caps if not c.label.startswith("replan")]
    what_ifs = len(caps) - len(timeline)  # the newest few survive, one private page each
    assert timeline == list(range(timeline[0], 3001, 10))
    assert 3000 - timeline[0] >= (16 - 3 - what_ifs - 2) * 128 - 150  # the rest of the log is timeline
    s.replan(0, np.stack([obs[:8]] * 3), commit_branch=1)  # a committed branch is timeline, not a what-if
    committed = s.live_capsule_id
    for o in obs[:600]:
        s.step(o)
        s.replan(0, np.stack([obs[:8]] * 3))
    assert committed in s.store


@pytest.mark.parametrize("kv_window", [128, 300, 1024])
def test_a_budget_at_the_printed_minimum_is_accepted(kv_window):
    cfg = small_config(kv_window=kv_window, capsule_capacity=0)
    with pytest.raises(ValueError, match="at least") as e:
        StoreSizes.plan(cfg.replace(capsule_budget_mb=0.01))
    minimum = float(str(e.value).split("at least ")[1].split(" MB")[0])
    for mb in (minimum + 0.1, minimum + 0.5, minimum + 1.3):
        sizes = StoreSizes.plan(cfg.replace(capsule_budget_mb=mb))
        assert sizes.records > sizes.reserve_records and sizes.log_pages >= sizes.reserve_pages
