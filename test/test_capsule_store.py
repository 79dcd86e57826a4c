"""CapsuleStore against a plain-Python model, plus export/import."""
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import observation_trace, small_config
from flashrt_ros.runtime import CapsuleError, Session, StoreFullOfPins

OPS = st.lists(st.tuples(st.sampled_from(["step", "snapshot", "rollback", "fork", "drop", "pin", "unpin",
                                           "export_import"]), st.integers(0, 10**6)), min_size=1, max_size=60)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=OPS)
def test_store_matches_a_plain_python_model(ops, tmp_path):
    s = Session(small_config(capsule_capacity=6, capsule_every_n_steps=2, max_branches=2))
    obs = observation_trace(len(ops) + 1)
    model: dict[int, tuple[bytes, bool]] = {}  # id -> (bytes, pinned), in age order
    seen_ids: set[int] = set()

    def add(info, data, protect=None):
        assert info.id not in seen_ids, "ids are never reused"
        seen_ids.add(info.id)
        if len(model) == s.store.capacity:  # evict the oldest unpinned (never a fork's source)
            victim = next(c for c, (_, p) in model.items() if not p and c != protect)
            del model[victim]
        model[info.id] = (data, info.pinned)

    for i, (op, r) in enumerate(ops):
        ids = list(model)
        pick = ids[r % len(ids)] if ids else 12345
        evictable = [c for c, (_, p) in model.items() if not p and not (op == "fork" and c == pick)]
        pinned_full = len(model) == s.store.capacity and not evictable
        n_pinned = sum(p for _, p in model.values())
        pin_refused = n_pinned + 1 > s.store.capacity - s.store.reserve  # pins never take the reserve
        try:
            if op == "step":
                res = s.step(obs[i])
                if res.capsule_id:
                    add(s.store.get(res.capsule_id), s.state_host().tobytes())
            elif op == "snapshot":
                pin = r % 3 == 0
                if pin and pin_refused:
                    with pytest.raises(StoreFullOfPins):
                        s.snapshot(pin=True)
                    continue
                add(s.snapshot(pin=pin), s.state_host().tobytes())
            elif op == "rollback":
                s.rollback(pick)
                assert s.state_host().tobytes() == model[pick][0]
            elif op == "fork":
                data = model.get(pick, (None,))[0]
                add(s.store.fork(pick), data, protect=pick)
            elif op == "drop":
                s.store.drop(pick)
                del model[pick]
            elif op in ("pin", "unpin"):
                if op == "pin" and pin_refused and pick in model and not model[pick][1]:
                    with pytest.raises(StoreFullOfPins):
                        s.pin(pick)
                    continue
                s.store.set_pinned(pick, op == "pin")
                model[pick] = (model[pick][0], op == "pin")
            elif op == "export_import":
                s.export_capsule(pick, tmp_path / "c.safetensors")
                add(s.import_capsule(tmp_path / "c.safetensors"), model[pick][0])
        except CapsuleError:
            assert pick not in model or pinned_full, f"{op} failed on a valid capsule"
            continue
        assert list(model) == [c.id for c in s.store.list()]
        for c in s.store.list():
            assert s.store.slot(c.id).tobytes() == model[c.id][0], "bytes equal what was snapshotted"
            assert c.pinned == model[c.id][1]


def test_export_import_round_trip_restores_bytes_and_metadata(session, trace, tmp_path):
    for o in trace[:12]:
        session.step(o, stamp_ns=1_000 + 1)
    info = session.store.get(7)
    sha = session.export_capsule(7, tmp_path / "seven.safetensors")
    fresh = Session(small_config())
    got = fresh.import_capsule(tmp_path / "seven.safetensors", restore=True)
    assert got.step == info.step == 7 and got.stamp_ns == info.stamp_ns
    assert fresh.state_host().tobytes() == session.store.slot(7).tobytes()
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
        assert set(f.keys()) == {s.name for s in session.arena.state_specs()}
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
