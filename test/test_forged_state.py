"""Forged state (issue 15, 7.4): a checksum anyone can recompute does not make a state safe.

A state no run of the policy can produce is refused at import (state/bounds.py); a step whose action
comes out non-finite is refused with the live state byte-identical; files can carry an HMAC.
"""
import os

import numpy as np
import pytest
from capsule_craft import craft, read_capsule

from conftest import assert_refused_unchanged, observation_trace, small_config
from flashrt_ros.runtime import CorruptCapsule, PolicyConfig, Session
from flashrt_ros.runtime.engine.backend import cuda_probe
from flashrt_ros.runtime.errors import NonFiniteAction, UnauthenticatedCapsule
from flashrt_ros.runtime.model.kernels import KV_PAGE
from flashrt_ros.runtime.state.capsule_file import load_hmac_key

BACKENDS = ["numpy", "cpu"] + (["cuda"] if cuda_probe() is None else [])  # the refusal runs on every backend here


def _set(name, value, index=0):
    def alter(tensors):
        tensors[name].reshape(-1)[index] = value
    return alter


@pytest.fixture
def good_file(stepped, tmp_path):
    path = tmp_path / "good.safetensors"
    stepped.export_capsule(0, path)
    return path


@pytest.mark.parametrize("cfg", [small_config(), small_config(action_noise_std=0.5, kv_window=40),
                                 small_config(n_layers=3, conv_kernel=2, chunk_len=6),
                                 PolicyConfig(kv_window=128, capsule_budget_mb=16, max_branches=2)],
                         ids=["small", "noise", "other_shapes", "default_model"])
def test_every_state_a_run_reaches_is_inside_the_bounds(cfg):
    s = Session(cfg)
    obs = observation_trace(300, seed=3) * 40.0  # large inputs: the bounds must not depend on the data
    for k, o in enumerate(obs):
        s.step(o)
        if k % 37 == 0:
            s.state_bounds.check(s.state_tensors())
    res = s.replan(0, np.stack([obs[:20]] * 2))
    for cid in res.branch_capsule_ids:
        s.state_bounds.check(s.materialize(cid))


@pytest.mark.parametrize("alter, match", [
    (_set("mtp_state", 7.4e29), r"mtp_state .*\|7\.4e\+29\| > 1"),
    (_set("recurrent_state.1", -1.5, 5), r"recurrent_state\.1 .*index 5"),
    (_set("k_cache.0", 1e6, 3), r"k_cache\.0 "),
    (_set("v_cache.1", -3e38), r"v_cache\.1 "),
    (_set("mtp_state", np.inf), "non-finite"),
])
def test_a_forged_file_with_a_recomputed_checksum_is_refused_and_the_state_is_unchanged(stepped, good_file,
                                                                                          tmp_path, alter, match):
    forged = craft(good_file, tmp_path / "forged.safetensors", alter=alter)
    assert_refused_unchanged(stepped, lambda: stepped.import_capsule(forged, restore=True), CorruptCapsule, match)


def test_an_unforged_recrafted_file_still_imports(stepped, good_file, tmp_path):
    same = craft(good_file, tmp_path / "same.safetensors")
    info = stepped.import_capsule(same, restore=True)
    assert stepped.live_capsule_id == info.id


def _poisoned_file(s, tmp_path):
    """A file only the conv state betrays: finite, within what the format allows, but the next step
    overflows float32 (conv_state has no bound: it holds the residual stream, which grows with the inputs)."""
    path = tmp_path / "clean.safetensors"
    s.export_capsule(0, path)
    return craft(path, tmp_path / "poison.safetensors", alter=lambda t: t["conv_state.0"].fill(3e38))


def _kv_accounting(s):
    """Page tables, references, the fill of every held page, the free pages."""
    held = s.kv.refs > 0
    return s.kv.tables.copy(), s.kv.refs.copy(), np.where(held, s.kv.fill, -1), sorted(s.kv.free)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("steps", [30, KV_PAGE - 1, KV_PAGE, 3 * KV_PAGE, 200],
                         ids=["mid_page", "last_slot", "page_boundary", "ring_wrap_frees_a_page", "after_a_rollback"])
def test_a_step_whose_action_would_be_non_finite_is_refused_with_the_state_byte_identical(tmp_path, steps, backend):
    ring_wrap = steps == 3 * KV_PAGE
    # ring_wrap: no capsules, so the live row alone holds the old page at this ring slot, and the step lets it go
    s = Session(small_config(kv_window=150, capsule_every_n_steps=1000 if ring_wrap else 1), backend)
    obs = observation_trace(steps + 5)
    for o in obs[:steps]:
        s.step(o)
    if steps == 200:  # the live page is shared with newer capsules: the step would copy it first
        s.rollback(steps_back=7)
    if ring_wrap:
        s.arena["conv_state.0"][0] = 3e38  # poisoned in place: an import would bring a table without that page
    else:
        s.import_capsule(_poisoned_file(s, tmp_path), restore=True)
    published = []
    before = (s.backend.to_host(s.live_row()).tobytes(), _kv_accounting(s))
    assert_refused_unchanged(s, lambda: s.step(obs[steps], on_action=published.append), NonFiniteAction,
                             "non-finite action.*nothing was published")
    assert published == []
    after = (s.backend.to_host(s.live_row()).tobytes(), _kv_accounting(s))
    assert after[0] == before[0]
    for a, b in zip(after[1][:3], before[1][:3]):
        assert np.array_equal(a, b)
    assert after[1][3] == before[1][3]
    # the state stays usable: a good capsule (or a reset) brings the robot back, and stepping goes on
    s.rollback(s.list_capsules()[0].id) if s.list_capsules() else s.reset()
    assert np.isfinite(s.step(obs[steps]).action).all()


def test_a_refused_step_leaves_a_session_that_continues_exactly_as_one_that_never_tried(tmp_path):
    obs = observation_trace(60)
    a, b = Session(small_config()), Session(small_config())
    for o in obs[:40]:
        a.step(o)
        b.step(o)
    good = a.live_capsule_id
    a.import_capsule(_poisoned_file(a, tmp_path), restore=True)
    with pytest.raises(NonFiniteAction):
        a.step(obs[40])
    a.rollback(good)
    for o in obs[40:]:
        assert a.step(o).action.tobytes() == b.step(o).action.tobytes()
    assert a.state_host().tobytes() == b.state_host().tobytes()


def test_a_replan_never_commits_a_branch_with_non_finite_actions(stepped, tmp_path):
    poisoned = stepped.import_capsule(_poisoned_file(stepped, tmp_path))
    obs = np.stack([observation_trace(4)] * 2)
    assert_refused_unchanged(stepped, lambda: stepped.replan(poisoned.id, obs, commit_branch=1), NonFiniteAction,
                             "branch 1 produced a non-finite action")


# ---- the authenticated file ----------------------------------------------------------------
def _key_file(tmp_path, text=b"0123456789abcdef0123456789abcdef\n", mode=0o600, name="key"):
    path = tmp_path / name
    path.write_bytes(text)
    os.chmod(path, mode)
    return path


def test_a_file_signed_with_the_key_round_trips_and_carries_its_mac(stepped, tmp_path):
    stepped.capsule_hmac_key = load_hmac_key(_key_file(tmp_path))
    path = tmp_path / "signed.safetensors"
    stepped.export_capsule(0, path)
    assert len(read_capsule(path)[0]["hmac_sha256"]) == 64
    want = stepped.state_host().tobytes()
    stepped.step(observation_trace(1)[0])
    stepped.import_capsule(path, restore=True)
    assert stepped.state_host().tobytes() == want


def test_with_a_key_unsigned_wrongly_signed_and_re_signed_forgeries_are_refused(stepped, tmp_path):
    unsigned, signed = tmp_path / "unsigned.safetensors", tmp_path / "signed.safetensors"
    stepped.export_capsule(0, unsigned)
    stepped.capsule_hmac_key = load_hmac_key(_key_file(tmp_path, b"another key, 32 bytes long......", name="k2"))
    stepped.export_capsule(0, signed)
    stepped.capsule_hmac_key = load_hmac_key(_key_file(tmp_path))
    assert_refused_unchanged(stepped, lambda: stepped.import_capsule(unsigned), UnauthenticatedCapsule, "no HMAC")
    assert_refused_unchanged(stepped, lambda: stepped.import_capsule(signed), UnauthenticatedCapsule,
                             "HMAC mismatch")
    stepped.export_capsule(0, signed)
    forged = craft(signed, tmp_path / "forged.safetensors", info={"label": "edited"})  # checksum redone, MAC kept
    assert_refused_unchanged(stepped, lambda: stepped.import_capsule(forged), UnauthenticatedCapsule,
                             "HMAC mismatch")
    stepped.capsule_hmac_key = None  # without a key the MAC cannot be checked: a signed file still imports
    stepped.import_capsule(signed)


@pytest.mark.parametrize("text, mode, match", [
    (b"short\n", 0o600, "at least 16"),
    (b"0123456789abcdef0123456789abcdef", 0o644, "readable by nobody else"),
    (b"0123456789abcdef0123456789abcdef", 0o620, "readable by nobody else"),
])
def test_a_weak_or_exposed_key_file_is_refused(tmp_path, text, mode, match):
    with pytest.raises(ValueError, match=match):
        load_hmac_key(_key_file(tmp_path, text, mode))


def test_a_missing_key_file_or_a_link_is_refused(tmp_path):
    with pytest.raises(ValueError, match="cannot open"):
        load_hmac_key(tmp_path / "nope")
    (tmp_path / "link").symlink_to(_key_file(tmp_path))
    with pytest.raises(ValueError, match="cannot open"):
        load_hmac_key(tmp_path / "link")
