"""Bags of the bytes rclpy's serialize_message makes (test/fixtures/data, committed, so no ROS wheels are needed):
each message ends past its last field (Fast-CDR sizes an empty float64 sequence as if aligned to 8), which
rosbags alone refuses. They replay in full; damaged messages are still refused and counted."""
import pytest
from fixtures import make_bags as mb
from fixtures.make_bags import JOINTS, RCLPY_STEPS, T0_NS, rclpy_bag, read_raw, trace
from fixtures.replay_cli import config_with, replay
from rosbags.serde import SerdeError

from flashrt_ros.tools.replay.bags import JOINT_STATE, decode_cdr, fastcdr_estimate, typestore

UNDECODABLE = f"undecodable {JOINT_STATE} (SerdeError)"


@pytest.fixture(scope="module")
def cfg(tmp_path_factory):
    """The shipped config with a 32 MB store: the bags' decoding is the subject, and each replay faulted in 512 MB."""
    return config_with(tmp_path_factory.mktemp("config"), capsule_budget_mb=32.0)


@pytest.fixture(scope="module")
def ts():
    return typestore()


@pytest.fixture(scope="module")
def rosbags_twin(tmp_path_factory):
    """The no_effort bag's observations and stamps, serialised by rosbags (no trailing bytes)."""
    stamps = [T0_NS + i * mb.PERIOD_NS for i in range(RCLPY_STEPS)]
    return mb.write_joint_messages(tmp_path_factory.mktemp("twin") / "twin", trace(RCLPY_STEPS), stamps)


@pytest.mark.parametrize("storage", ["mcap", "sqlite3"])
@pytest.mark.parametrize("kind, trailing", [("no_effort", 4), ("no_velocity", 8)])
def test_rclpy_messages_end_in_bytes_rosbags_refuses_and_decode_to_the_values_written(ts, kind, trailing, storage):
    messages = read_raw(rclpy_bag(kind, storage))
    assert [ns for ns, _ in messages] == [T0_NS + i * mb.PERIOD_NS for i in range(RCLPY_STEPS)]
    obs = trace(RCLPY_STEPS)
    for i, (_, raw) in enumerate(messages):
        with pytest.raises(SerdeError, match="size mismatch"):
            ts.deserialize_cdr(raw, JOINT_STATE)
        msg = decode_cdr(ts, raw, JOINT_STATE)
        canonical = bytes(ts.serialize_cdr(msg, JOINT_STATE))
        assert len(raw) - len(canonical) == trailing
        assert len(raw) - 4 == fastcdr_estimate(ts, msg, JOINT_STATE)
        assert list(msg.name) == JOINTS and msg.header.frame_id == "base_link" and len(msg.effort) == 0
        assert msg.position.tobytes() == obs[i, :7].tobytes()
        assert msg.velocity.tobytes() == (obs[i, 7:].tobytes() if kind == "no_effort" else b"")


@pytest.mark.parametrize("storage", ["mcap", "sqlite3"])
def test_every_message_of_an_rclpy_bag_with_an_empty_effort_is_stepped(storage, cfg, rosbags_twin):
    summary, _ = replay(rclpy_bag("no_effort", storage), "--config", cfg)
    assert summary["messages"] == summary["steps"] == RCLPY_STEPS
    assert summary["rejected"] == {"count": 0, "reasons": {}}
    twin, _ = replay(rosbags_twin, "--config", cfg)
    assert summary["actions_sha256"] == twin["actions_sha256"]  # the same observations as rosbags' bytes give


@pytest.mark.parametrize("storage", ["mcap", "sqlite3"])
def test_joint_states_without_velocities_decode_and_are_refused_as_missing_velocities(storage, cfg):
    summary, res = replay(rclpy_bag("no_velocity", storage), "--config", cfg, expect=3)
    assert summary["messages"] == RCLPY_STEPS and summary["steps"] == 0
    assert summary["rejected"]["reasons"] == {
        "JointState has 7 names, 7 positions and 0 velocities: it carries no velocities, and an observation is "
        "positions then velocities (not zero-filled)": RCLPY_STEPS}
    assert "undecodable" not in res.stdout + res.stderr


def _damaged(raw: bytes, how: str) -> bytes:
    return {"garbage_past_the_estimate": raw + b"\xde\xad\xbe\xef",
            "one_byte_past_the_estimate": raw + b"\x00",
            "truncated_into_the_effort_count": raw[:-5],
            "truncated_into_a_velocity": raw[:-12]}[how]


DAMAGES = ["garbage_past_the_estimate", "one_byte_past_the_estimate", "truncated_into_the_effort_count",
           "truncated_into_a_velocity"]


@pytest.mark.parametrize("how", DAMAGES)
def test_a_damaged_rclpy_message_is_refused(ts, how):
    _, raw = read_raw(rclpy_bag("no_effort", "mcap"))[0]
    with pytest.raises(SerdeError, match="size mismatch" if "past" in how else "Could not deserialize"):
        decode_cdr(ts, _damaged(raw, how), JOINT_STATE)


def test_trailing_bytes_are_checked_by_number_not_content(ts):
    """rclpy leaves them uninitialised (here they are not zero): any content passes, and so does none."""
    _, raw = read_raw(rclpy_bag("no_effort", "mcap"))[0]
    assert raw[-4:] != bytes(4)
    want = decode_cdr(ts, raw, JOINT_STATE)
    for variant in (raw[:-4], raw[:-4] + bytes(4), raw[:-4] + b"\xff" * 4, raw[:-1]):
        got = decode_cdr(ts, variant, JOINT_STATE)
        assert bytes(ts.serialize_cdr(got, JOINT_STATE)) == bytes(ts.serialize_cdr(want, JOINT_STATE))


@pytest.mark.parametrize("storage", ["mcap", "sqlite3"])
def test_damaged_messages_among_rclpy_ones_are_counted_and_the_rest_stepped(tmp_path, cfg, storage):
    messages = read_raw(rclpy_bag("no_effort", "mcap"))
    bad = {i: DAMAGES[k % len(DAMAGES)] for k, i in enumerate(range(1, RCLPY_STEPS, 3))}
    mixed = [(ns, _damaged(raw, bad[i]) if i in bad else raw) for i, (ns, raw) in enumerate(messages)]
    summary, _ = replay(mb.write_raw_bag(tmp_path / "mixed", storage, mixed), "--config", cfg)
    assert summary["messages"] == RCLPY_STEPS and summary["steps"] == RCLPY_STEPS - len(bad)
    assert summary["rejected"] == {"count": len(bad), "reasons": {UNDECODABLE: len(bad)}}
