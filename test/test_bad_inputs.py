"""Every rejected input raises a clear error and leaves the live state byte-identical."""
import numpy as np
import pytest

from conftest import observation_trace, small_config
from flashrt_ros.runtime import (
    CorruptCapsule,
    FingerprintMismatch,
    PolicyConfig,
    Session,
    StoreFullOfPins,
    UnknownCapsule,
)


@pytest.fixture
def stepped(session, trace):
    for o in trace[:20]:
        session.step(o)
    return session


def unchanged(session, fn, exc, match):
    before = session.state_host().tobytes()
    live, step, n = session.live_capsule_id, session.step_count, len(session.store)
    with pytest.raises(exc, match=match):
        fn()
    assert session.state_host().tobytes() == before
    assert (session.live_capsule_id, session.step_count, len(session.store)) == (live, step, n)


@pytest.mark.parametrize("obs, match", [
    (np.zeros(13, np.float32), "shape"),
    (np.zeros((1, 14), np.float32), "shape"),
    (np.zeros(14, np.int32), "dtype"),
    (np.array([np.nan] + [0.0] * 13), "non-finite"),
    (np.array([0.0] * 5 + [np.inf] + [0.0] * 8, np.float32), "index 5"),
    ("fourteen", "dtype"),
])
def test_bad_observation_is_rejected_and_state_untouched(stepped, obs, match):
    unchanged(stepped, lambda: stepped.step(obs), ValueError, match)


@pytest.mark.parametrize("kw, match", [
    (dict(capsule_id=999), "unknown capsule"),
    (dict(capsule_id=0, steps_back=500), "before step 0"),
])
def test_bad_rollback_is_rejected_and_state_untouched(stepped, kw, match):
    unchanged(stepped, lambda: stepped.rollback(**kw), UnknownCapsule, match)


def test_evicted_capsule_is_named_as_evicted():
    s = Session(small_config(capsule_capacity=8, max_branches=2))
    for o in observation_trace(20):
        s.step(o)
    unchanged(s, lambda: s.rollback(3), UnknownCapsule, "evicted")
    unchanged(s, lambda: s.rollback(steps_back=15), UnknownCapsule, "evicted")


@pytest.mark.parametrize("obs, kw, match", [
    (np.zeros((9, 2, 14), np.float32), {}, "branches"),
    (np.zeros((2, 0, 14), np.float32), {}, "horizon"),
    (np.zeros((2, 2, 13), np.float32), {}, "shape"),
    (np.zeros((2, 14), np.float32), {}, "branches, horizon"),
    (np.full((2, 2, 14), np.nan, np.float32), {}, "non-finite"),
    (np.zeros((2, 2, 14), np.float32), dict(commit_branch=2), "commit_branch"),
    (np.zeros((2, 2, 14), np.float32), dict(deadline_ms=0), "deadline_ms"),
])
def test_malformed_replan_is_rejected_and_state_untouched(stepped, obs, kw, match):
    unchanged(stepped, lambda: stepped.replan(0, obs, **kw), ValueError, match)


def test_replan_from_unknown_capsule_is_rejected(stepped):
    unchanged(stepped, lambda: stepped.replan(12345, np.zeros((1, 1, 14), np.float32)), UnknownCapsule, "unknown")


def test_corrupt_truncated_and_foreign_capsule_files_are_rejected(stepped, tmp_path):
    good = tmp_path / "c.safetensors"
    stepped.export_capsule(5, good)
    raw = good.read_bytes()
    (tmp_path / "trunc.safetensors").write_bytes(raw[: len(raw) // 2])
    flipped = bytearray(raw)
    flipped[-100] ^= 0xFF  # a state byte, not the header
    (tmp_path / "flip.safetensors").write_bytes(bytes(flipped))
    (tmp_path / "junk.safetensors").write_bytes(b"not a capsule at all")
    cases = [("trunc", "readable"), ("flip", "checksum"), ("junk", "readable|header"), ("missing", "no such")]
    for name, match in cases:
        path = tmp_path / f"{name}.safetensors"
        unchanged(stepped, lambda p=path: stepped.import_capsule(p, restore=True), CorruptCapsule, match)
    other = Session(small_config(seed=1))
    other.step(np.zeros(14, np.float32))
    other.export_capsule(1, tmp_path / "other.safetensors")
    unchanged(stepped, lambda: stepped.import_capsule(tmp_path / "other.safetensors", restore=True),
              FingerprintMismatch, "fingerprint")


def test_pins_are_refused_before_they_could_wedge_the_live_step(trace):
    s = Session(small_config(capsule_capacity=4, max_branches=1))
    for o in trace[:4]:
        s.step(o)
    s.pin(1)
    s.pin(2)  # 4 slots - (1 live + 1 branch) reserved = 2 pins at most
    unchanged(s, lambda: s.pin(3), StoreFullOfPins, "pinned")
    unchanged(s, lambda: s.snapshot(pin=True), StoreFullOfPins, "pinned")
    for o in trace[4:20]:  # the live step still takes a capsule every step
        assert s.step(o).capsule_id == s.live_capsule_id > 0
    assert {c.id for c in s.list_capsules(pinned_only=True)} == {1, 2}


@pytest.mark.parametrize("kw, field", [
    (dict(d_model=0), "d_model"), (dict(n_heads=3), "n_heads"), (dict(kv_window=-1), "kv_window"),
    (dict(action_noise_std=float("nan")), "action_noise_std"), (dict(obs_dim="14"), "obs_dim"),
    (dict(capsule_every_n_steps=0), "capsule_every_n_steps"), (dict(max_branches=True), "max_branches"),
])
def test_bad_config_names_the_field(kw, field):
    with pytest.raises(ValueError, match=field):
        PolicyConfig(**kw)


def test_budget_too_small_for_one_capsule_is_a_clear_error():
    with pytest.raises(ValueError, match="capsule_budget_mb"):
        Session(small_config(capsule_budget_mb=0.01))


@pytest.fixture
def good_capsule(stepped, tmp_path):
    path = tmp_path / "good.safetensors"
    stepped.export_capsule(10, path)
    return path


def test_recrafted_capsule_with_nothing_changed_imports(stepped, good_capsule, tmp_path):
    """The control for the hostile cases below: crafting alone does not break a file."""
    from capsule_craft import craft
    info = stepped.import_capsule(craft(good_capsule, tmp_path / "same.safetensors"))
    assert info.step == 10


@pytest.mark.parametrize("case", sorted(__import__("capsule_craft").HOSTILE))
def test_hostile_capsule_with_a_valid_checksum_is_refused_and_state_untouched(stepped, good_capsule, tmp_path,
                                                                              case):
    from capsule_craft import HOSTILE, craft
    path = craft(good_capsule, tmp_path / f"{case}.safetensors", **HOSTILE[case])
    unchanged(stepped, lambda: stepped.import_capsule(path, restore=True), CorruptCapsule,
              "bad metadata|non-finite")


def test_a_thousand_failed_imports_take_no_slot_and_the_live_step_still_gets_a_capsule(stepped, good_capsule,
                                                                                      tmp_path, trace):
    from capsule_craft import HOSTILE, craft
    path = craft(good_capsule, tmp_path / "abc.safetensors", **HOSTILE["step_string"])
    n, usage = len(stepped.store), stepped.store_usage()
    for _ in range(1000):
        with pytest.raises(CorruptCapsule):
            stepped.import_capsule(path)
    assert len(stepped.store) == n and stepped.store_usage() == usage
    res = stepped.step(trace[20])
    assert res.capsule_id == stepped.live_capsule_id > 0


def test_label_longer_than_256_characters_is_refused(stepped):
    unchanged(stepped, lambda: stepped.snapshot(label="x" * 257), ValueError, "label")
    assert stepped.snapshot(label="x" * 256).label == "x" * 256


def test_unpin_frees_room_for_another_pin(trace):
    s = Session(small_config(capsule_capacity=4, max_branches=1))
    for o in trace[:4]:
        s.step(o)
    s.pin(1)
    s.pin(2)
    unchanged(s, lambda: s.pin(3), StoreFullOfPins, "pinned")
    assert not s.unpin(1).pinned
    assert s.pin(3).pinned
