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


@pytest.mark.parametrize("call, match", [
    (lambda s: s.rollback(steps_back=1.5), "steps_back: expected an integer"),
    (lambda s: s.rollback(steps_back="3"), "steps_back: expected an integer"),
    (lambda s: s.rollback(steps_back=-1), "steps_back: must be >= 0"),
    (lambda s: s.rollback(capsule_id=2.0), "capsule_id: expected an integer"),
    (lambda s: s.replan(3.5, np.zeros((1, 1, 14), np.float32)), "capsule_id: expected an integer"),
    (lambda s: s.pin(None), "capsule_id: expected an integer"),
    (lambda s: s.unpin("1"), "capsule_id: expected an integer"),
    (lambda s: s.drop(None), "capsule_id: expected an integer"),
    (lambda s: s.materialize(None), "capsule_id: expected an integer"),
    (lambda s: s.export_capsule(1.0, "x.safetensors"), "capsule_id: expected an integer"),
], ids=["steps_back_float", "steps_back_str", "steps_back_negative", "rollback_id_float", "replan_id_float",
        "pin_none", "unpin_str", "drop_none", "materialize_none", "export_id_float"])
def test_an_argument_that_is_not_an_integer_is_refused_naming_it(stepped, call, match):
    unchanged(stepped, lambda: call(stepped), ValueError, match)


def test_a_prefill_longer_than_the_history_kept_is_refused_before_anything_changes():
    s = Session(small_config(history_limit=10))
    for o in observation_trace(5):
        s.step(o)
    unchanged(s, lambda: s.prefill_from(observation_trace(20)), ValueError, "keeps at most 19")
    s.prefill_from(observation_trace(19))  # the longest it keeps
    assert s.step_count == 19


def test_a_prefill_that_drives_the_state_non_finite_leaves_the_session_reset_not_non_finite():
    from flashrt_ros.runtime.errors import NonFiniteAction
    s = Session(small_config())
    for o in observation_trace(5):
        s.step(o)
    with pytest.raises(NonFiniteAction, match="the session is reset"), np.errstate(all="ignore"):
        s.prefill_from(np.full((5, 14), 3e38, np.float32))
    assert s.step_count == 0
    assert all(np.isfinite(t).all() for t in s.state_tensors(0).values() if t.dtype.kind == "f")
    assert s.step(observation_trace(1)[0]).step == 1  # and it steps on


@pytest.mark.parametrize("change, match", [
    (lambda w, name: w.pop(name), "missing"),
    (lambda w, name: w.update(bogus=np.zeros(1, np.float32)), "unexpected"),
    (lambda w, name: w.update({name: np.float32(0.5)}), "expected float32"),
    (lambda w, name: w[name].__setitem__((0,) * w[name].ndim, np.nan), "non-finite"),
], ids=["missing", "extra", "a_scalar", "nan"])
def test_weights_handed_to_a_session_get_the_checks_of_a_weights_file(change, match):
    from flashrt_ros.runtime.model.weights import WeightsError
    weights = {n: w.copy() for n, w in Session(small_config()).weights.items()}
    name = next(n for n, w in weights.items() if w.ndim == 2)
    change(weights, name)
    with pytest.raises(WeightsError, match=match):
        Session(small_config(), weights=weights)


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
    # not an integer: refused naming it, not rounded, taken as 1, or failing after every step ran
    (np.zeros((2, 2, 14), np.float32), dict(commit_branch=1.5), "commit_branch: expected an integer"),
    (np.zeros((2, 2, 14), np.float32), dict(commit_branch=True), "commit_branch: expected an integer"),
    (np.zeros((2, 2, 14), np.float32), dict(deadline_ms="5"), "deadline_ms: expected a number"),
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
    # past what the runtime can hold: inf, past float32 (inf on the device), a seed past the RNG's 32-bit key
    (dict(capsule_budget_mb=float("inf")), "capsule_budget_mb"), (dict(action_noise_std=1e39), "action_noise_std"),
    (dict(seed=2**63 + 5), "seed"),
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
