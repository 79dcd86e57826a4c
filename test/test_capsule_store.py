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


def test_the_step_index_stays_bounded_when_diagnostics_pop_the_evicted_oldest_and_not_the_newest(trace):
    """A full store evicts its oldest capsule every step; usage() (every second in the node) pops those stale
    entries from the top of the oldest-step heap only. The newest-step heap must not keep them all."""
    s = Session(small_config(capsule_capacity=40))
    for i in range(1500):
        s.step(trace[i % len(trace)])
        if i % 10 == 0:
            s.store.usage()
    caps = len(s.store)
    assert caps == 40
    assert len(s.store._low) + len(s.store._high) <= 4 * caps + 128 + 2  # noqa: SLF001


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
