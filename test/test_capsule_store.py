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
