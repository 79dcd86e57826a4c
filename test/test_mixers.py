"""The recurrent slot of a block is a config choice (mixer: gru | ssm). The selective SSM gets what the GRU
has with no code of its own outside its op, kernel and twin: its state is in every capsule, files and the
persisted log carry it, a file or log of the other mixer is refused by fingerprint, and replan branches
equal live stepping. (test_determinism, test_prefill and test_shim_plan run their contracts for both.)"""
import numpy as np
import pytest
from persist_fixtures import settings

from conftest import assert_refused_unchanged, observation_trace, small_config
from flashrt_ros.runtime import Session
from flashrt_ros.runtime.errors import FingerprintMismatch

OBS = observation_trace(200)


def stepped(mixer: str, n: int = 120, **kw) -> Session:
    s = Session(small_config(mixer=mixer, **kw))
    for o in OBS[:n]:
        s.step(o)
    return s


def test_the_ssm_state_is_small_state_of_every_layer_and_the_gru_state_is_gone():
    s = stepped("ssm", 10)
    small = {spec.name: spec.role for spec in s.arena.state_specs()}
    assert small["ssm_state.0"] == small["ssm_state.1"] == "recurrent"
    assert not any(n.startswith("recurrent_state") for n in small)
    assert np.abs(s.state_tensors()["ssm_state.1"]).max() > 0  # it carries the load


def test_an_unknown_mixer_is_refused_naming_the_choices():
    with pytest.raises(ValueError, match="mixer: must be one of gru, ssm, got 'lstm'"):
        small_config(mixer="lstm")


@pytest.mark.parametrize("mixer, other", [("ssm", "gru"), ("gru", "ssm")])
def test_a_capsule_file_round_trips_and_a_file_of_the_other_mixer_is_refused(mixer, other, tmp_path):
    s = stepped(mixer)
    path = tmp_path / "c.safetensors"
    s.export_capsule(s.live_capsule_id, path)
    want = s.state_host().tobytes()
    s.rollback(steps_back=40)
    s.import_capsule(path, restore=True)
    assert s.state_host().tobytes() == want
    o = stepped(other, 30)
    assert_refused_unchanged(o, lambda: o.import_capsule(path), FingerprintMismatch, "does not match")


def test_replan_branches_of_the_ssm_are_byte_identical_to_live_stepping():
    s = stepped("ssm")
    cid = s.pin(s.live_capsule_id).id
    branches = np.stack([OBS[120:130], OBS[140:150] * 0.5, OBS[160:170]])
    res = s.replan(cid, branches)
    for b in range(3):
        s.rollback(cid)
        live = np.stack([s.step(o).action for o in branches[b]])
        assert live.tobytes() == res.actions[b].tobytes()


def test_persistence_resumes_the_ssm_byte_exactly_and_refuses_a_gru_log(tmp_path):
    s = Session(small_config(mixer="ssm"))
    s.enable_persistence(settings(tmp_path))
    for o in OBS[:80]:
        s.step(o)
    s.disable_persistence()
    r = Session(small_config(mixer="ssm"))
    r.enable_persistence(settings(tmp_path), resume=True)
    assert r.state_host().tobytes() == s.state_host().tobytes()
    assert [r.step(o).action.tobytes() for o in OBS[80:90]] == [s.step(o).action.tobytes() for o in OBS[80:90]]
    r.disable_persistence()
    gru = stepped("gru", 5)
    assert_refused_unchanged(gru, lambda: gru.enable_persistence(settings(tmp_path), resume=True),
                             FingerprintMismatch, "another config, weights or plan")
