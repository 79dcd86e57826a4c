"""CapsuleStore: export/import, lineage, eviction. The full-copy oracle is in test_capsule_oracle.py."""
import numpy as np

from conftest import small_config
from flashrt_ros.runtime import Session


def test_export_import_round_trip_restores_bytes_and_metadata(session, trace, tmp_path):
    for o in trace[:12]:
        session.step(o, stamp_ns=1_000 + 1)
    info = session.store.get(7)
    sha = session.export_capsule(7, tmp_path / "seven.safetensors")
    fresh = Session(small_config())
    got = fresh.import_capsule(tmp_path / "seven.safetensors", restore=True)
    assert got.step == info.step == 7 and got.stamp_ns == info.stamp_ns
    assert fresh.state_host().tobytes() == session.capsule_host(7).tobytes()
    from safetensors import safe_open
    with safe_open(str(tmp_path / "seven.safetensors"), framework="numpy") as f:
        assert f.metadata()["state_sha256"] == sha
    session.rollback(7)
    a = np.stack([session.step(o).action for o in trace[50:60]])
    b = np.stack([fresh.step(o).action for o in trace[50:60]])
    assert a.tobytes() == b.tobytes()


def test_export_writes_one_tensor_per_state_buffer(session, trace, tmp_path):
    from safetensors import safe_open
    session.step(trace[0])
    session.export_capsule(1, tmp_path / "one.safetensors")
    with safe_open(str(tmp_path / "one.safetensors"), "numpy") as f:
        assert set(f.keys()) == {s.name for s in session.policy.window_specs()}  # KV window gathered in
        meta = f.metadata()
    assert meta["fingerprint"] == session.fingerprint and len(meta["sha256"]) == 64


def test_rollback_by_steps_back_walks_the_lineage(session, trace):
    for o in trace[:30]:
        session.step(o)
    assert session.rollback(steps_back=10).step == 20
    assert session.rollback(steps_back=5).step == 15
    assert session.store.get(session.live_capsule_id).parent_id == 14


def test_rollback_with_sparse_capsules_takes_the_newest_not_after_target(trace):
    s = Session(small_config(capsule_every_n_steps=4))
    for o in trace[:30]:
        s.step(o)
    assert s.rollback(steps_back=5).step == 24  # live 30 -> target 25 -> capsule at 24


def test_the_step_index_holds_only_the_steps_of_capsules_held_through_a_full_store(trace):
    """A full store evicts its oldest capsule every step, with usage() asked every 10 (the node's diagnostics):
    the per-step index shrinks with every eviction, so it never grows past the capsules held."""
    s = Session(small_config(capsule_capacity=40))
    for i in range(1500):
        s.step(trace[i % len(trace)])
        if i % 10 == 0:
            u = s.store.usage()
            assert (u.oldest_step, u.newest_step) == (max(1, i + 1 - 39), i + 1)
    assert len(s.store) == 40 and len(s.store._at_step) == 40  # noqa: SLF001


def test_usage_finds_the_oldest_and_newest_step_across_a_gap_longer_than_its_walk(trace):
    s = Session(small_config())
    for o in trace[:10]:
        s.step(o)
    far = 10 + 3 * s.store.STEP_WALK
    s.store.snapshot(0, step=far)
    assert (s.store.usage().oldest_step, s.store.usage().newest_step) == (1, far)
    for c in s.store.list()[:-1]:  # every capsule but the far one: the oldest jumps past the walk
        s.store.drop(c.id)
    assert (s.store.usage().oldest_step, s.store.usage().newest_step) == (far, far)
    for o in trace[10:13]:
        s.step(o)  # steps 11-13: the newest falls back across the gap once the far one goes
    s.store.drop(s.store.list()[0].id)
    assert (s.store.usage().oldest_step, s.store.usage().newest_step) == (11, 13)


def test_an_id_given_again_at_another_step_after_clear_reports_its_own_step(trace):
    """A resume clears the store and rebuilds it under the log's ids: an id's old step must not come back."""
    s = Session(small_config())
    for o in trace[:10]:
        s.step(o)
    s.store.clear()
    s.store.snapshot(0, step=100, cid=5)
    u = s.store.usage()
    assert (u.capsules, u.oldest_step, u.newest_step) == (1, 100, 100)


def test_usage_kept_as_capsules_come_and_go_equals_a_walk_over_every_capsule(trace):
    """usage() no longer walks the store (diagnostics ask it every second, under the session lock): its pin
    count and oldest / newest step, kept as capsules are added, pinned, dropped and evicted, equal a walk."""
    rng = np.random.default_rng(3)
    s = Session(small_config(capsule_capacity=40))  # evicts within the trace
    for i, o in enumerate(trace[:300]):
        s.step(o)
        held = s.store.list()
        op = rng.integers(8)
        if op == 0 and len(s.store.list(pinned_only=True)) < 5:
            s.pin(int(rng.choice([c.id for c in held])))
        elif op == 1 and s.store.list(pinned_only=True):
            s.unpin(s.store.list(pinned_only=True)[0].id)
        elif op == 2 and i > 20:
            s.rollback(steps_back=int(rng.integers(1, 10)))  # older steps held again as newest capsules
        elif op == 3 and i % 25 == 0:
            s.replan(None, np.tile(o, (2, 3, 1)))  # what-ifs: newer steps, evicted first
        elif op == 4 and len(held) > 3:
            s.drop(held[1].id)
        u, held = s.store.usage(), s.store.list()
        steps = [c.step for c in held]
        assert (u.capsules, u.pinned, u.oldest_step, u.newest_step) == (
            len(held), sum(c.pinned for c in held), min(steps), max(steps)), i
