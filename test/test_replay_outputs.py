"""flashrt-replay's output bags: what Humble's rosbag2 reads, an independent MCAP reader decodes, and the
input's stamps and frame ids kept."""
import json

import numpy as np
import pytest
import yaml
from fixtures.make_bags import T0_NS, trace, write_joint_messages
from fixtures.replay_cli import TINY_CONFIG, config_with, replay

from flashrt_ros.tools.replay.bags import read_policy_steps, typestore

# What Humble's QoS decoder (rosbag2_transport, qos.cpp) reads from each profile: enums as integers.
HUMBLE_QOS_INT_FIELDS = ("history", "depth", "reliability", "durability", "liveliness")
HUMBLE_QOS_DURATION_FIELDS = ("deadline", "lifespan", "liveliness_lease_duration")


def humble_read_metadata(bag_dir):
    """Parse metadata.yaml the way Humble's rosbag2_storage/yaml.hpp does (yaml-cpp `as<T>` on each field),
    raising where Humble raises. Returns the info and each topic's parsed QoS profiles."""
    info = yaml.safe_load((bag_dir / "metadata.yaml").read_text())["rosbag2_bagfile_information"]
    version = info["version"]
    assert isinstance(version, int)
    for key in ("duration", "starting_time"):
        assert isinstance(next(iter(info[key].values())), int)
    assert isinstance(info["message_count"], int) and all(isinstance(p, str) for p in info["relative_file_paths"])
    if version >= 3:
        assert isinstance(info["compression_format"], str) and isinstance(info["compression_mode"], str)
    if version >= 5:
        for f in info["files"]:
            assert isinstance(f["path"], str) and isinstance(f["message_count"], int)
    profiles = {}
    for t in info["topics_with_message_count"]:
        md = t["topic_metadata"]
        assert all(isinstance(md[k], str) for k in ("name", "type", "serialization_format"))
        if version >= 4:
            # Humble: topic.offered_qos_profiles = node["offered_qos_profiles"].as<std::string>(); a YAML
            # sequence there throws YAML::TypedBadConversion and `ros2 bag info` fails.
            qos = md["offered_qos_profiles"]
            assert isinstance(qos, str), f"{md['name']}: offered_qos_profiles is {type(qos).__name__}, Humble reads str"
            profiles[md["name"]] = yaml.safe_load(qos) or []
    return info, profiles


def check_humble_qos(profiles: list) -> None:
    for p in profiles:
        for k in HUMBLE_QOS_INT_FIELDS:
            assert isinstance(p[k], int) and not isinstance(p[k], bool), f"{k}: {p[k]!r}; Humble reads an int"
        for k in HUMBLE_QOS_DURATION_FIELDS:
            assert isinstance(p[k]["sec"], int) and isinstance(p[k]["nsec"], int)
        assert isinstance(p["avoid_ros_namespace_conventions"], bool)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A 60-step replay of a JointState bag (frame base_link) into an mcap output bag."""
    tmp = tmp_path_factory.mktemp("outputs")
    obs = trace(60)
    bag = write_joint_messages(tmp / "in", obs, [T0_NS + i * 10_000_000 for i in range(60)], frame_id="base_link")
    cfg = config_with(tmp, base=TINY_CONFIG)
    summary, _ = replay(bag, "--config", cfg, "--out", tmp / "out")
    return summary, tmp / "out", cfg, bag


@pytest.mark.parametrize("storage", ["mcap", "sqlite3"])
def test_output_metadata_is_what_humble_rosbag2_reads(run, tmp_path, storage):
    _, _, cfg, bag = run
    replay(bag, "--config", cfg, "--out", tmp_path / "out", "--storage", storage)
    info, profiles = humble_read_metadata(tmp_path / "out")
    assert 4 <= info["version"] <= 8  # >= 4: QoS as a string (all of Humble, Jazzy, Kilted); 9: a list
    assert set(profiles) == {"/action", "/policy_step", "/capsule_stream"}
    for topic_profiles in profiles.values():
        assert topic_profiles, "the profile the node offers is recorded, so `ros2 bag play` can offer it"
        check_humble_qos(topic_profiles)
    assert all(isinstance(t["topic_metadata"]["type_description_hash"], str)  # Jazzy reads it from version 7
               for t in info["topics_with_message_count"])


def test_mcap_channels_carry_qos_that_humble_parses(run):
    from mcap.reader import make_reader

    _, out, _, _ = run
    with open(next(out.glob("*.mcap")), "rb") as f:
        channels = make_reader(f).get_summary().channels.values()
    assert {c.topic for c in channels} == {"/action", "/policy_step", "/capsule_stream"}
    for c in channels:  # Humble's mcap plugin parses this string with the same QoS decoder
        check_humble_qos(yaml.safe_load(c.metadata["offered_qos_profiles"]))


def test_an_independent_mcap_reader_decodes_every_output_message(run):
    """`mcap` + `mcap-ros2-support` decode from the definitions embedded in the file, custom type included."""
    from mcap.reader import make_reader
    from mcap_ros2.decoder import DecoderFactory

    summary, out, _, _ = run
    seen = {"/action": [], "/policy_step": [], "/capsule_stream": []}
    with open(next(out.glob("*.mcap")), "rb") as f:
        for schema, channel, message, decoded in make_reader(f, decoder_factories=[DecoderFactory()]) \
                .iter_decoded_messages():
            seen[channel.topic].append((schema.name, message.log_time, decoded))
    assert len(seen["/action"]) == len(seen["/policy_step"]) == summary["steps"] == 60
    assert {s for s, _, _ in seen["/action"]} == {"std_msgs/msg/Float64MultiArray"}
    assert {s for s, _, _ in seen["/policy_step"]} == {"flashrt_interfaces/msg/PolicyStep"}
    # the run's capsule records, one per step at its stamp, in order, none dropped
    assert [(s, t, r.step, r.seq) for s, t, r in seen["/capsule_stream"]] == [
        ("flashrt_interfaces/msg/CapsuleRecord", T0_NS + i * 10_000_000, i + 1, i + 1) for i in range(60)]
    assert summary["capsule_stream"]["records"] == 60 and summary["capsule_stream"]["dropped"] == 0
    ours = read_policy_steps(out, typestore())
    for i, ((_, t_a, action), (_, t_s, step), mine) in enumerate(zip(seen["/action"], seen["/policy_step"], ours)):
        stamp = T0_NS + i * 10_000_000
        assert t_a == t_s == stamp
        assert step.header.stamp.sec * 10**9 + step.header.stamp.nanosec == stamp
        assert step.header.frame_id == "base_link"
        assert step.step == i + 1 and step.chunk_len == 2 and len(step.action_chunk) == 2 * 7
        assert np.asarray(step.action, np.float32).tobytes() == np.asarray(mine.action, np.float32).tobytes()
        assert np.array_equal(np.asarray(action.data), np.asarray(step.action, np.float32).astype(np.float64))


def test_input_frame_id_is_kept_in_the_outputs(run):
    _, out, _, _ = run
    assert {m.header.frame_id for m in read_policy_steps(out, typestore())} == {"base_link"}


def test_an_existing_out_directory_is_refused_before_the_replay_starts(run, tmp_path):
    _, _, cfg, bag = run
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "keep.txt").write_text("mine")
    _, res = replay(bag, "--config", cfg, "--out", tmp_path / "taken", expect=2)
    assert "output exists" in res.stderr and res.stdout == ""
    assert "offline:" not in res.stderr  # refused before the bag was even opened
    assert (tmp_path / "taken" / "keep.txt").read_text() == "mine"


def test_a_negative_header_stamp_is_rejected_by_reason_and_the_rest_is_written(run, tmp_path):
    _, _, cfg, _ = run
    obs = trace(20)
    stamps = [T0_NS + i * 10_000_000 for i in range(20)]
    headers = [(s // 10**9, s % 10**9) for s in stamps]
    headers[7] = (-5, 0)
    bag = write_joint_messages(tmp_path / "neg", obs, stamps, header_stamps=headers)
    summary, _ = replay(bag, "--config", cfg, "--out", tmp_path / "out")
    assert summary["steps"] == 19
    assert summary["rejected"] == {"count": 1, "reasons": {
        "header stamp is negative (sec=-5, nanosec=0); rosbag2 stores unsigned times": 1}}
    assert len(read_policy_steps(tmp_path / "out", typestore())) == 19


def test_a_stamp_past_the_last_ros_time_is_rejected_by_reason_and_the_rest_is_written(run, tmp_path):
    from flashrt_ros.runtime.state.capsule_file import MAX_STAMP_NS
    _, _, cfg, _ = run
    obs = trace(20)
    stamps = [T0_NS + i * 10_000_000 for i in range(20)]
    headers = [(s // 10**9, s % 10**9) for s in stamps]
    headers[7] = (2**31 - 1, 2**32 - 10)  # int32 seconds, a nanosecond field past one second: past the last Time
    bag = write_joint_messages(tmp_path / "late", obs, stamps, header_stamps=headers)
    summary, _ = replay(bag, "--config", cfg, "--out", tmp_path / "out")
    assert summary["steps"] == 19
    late = (2**31 - 1) * 10**9 + 2**32 - 10
    assert summary["rejected"] == {"count": 1, "reasons": {
        f"stamp {late} ns is past the last ROS Time (int32 seconds, {MAX_STAMP_NS} ns, January 2038)": 1}}


@pytest.mark.parametrize("where", ["a_directory", "a_missing_directory"])
def test_a_json_path_that_cannot_be_written_is_refused_before_the_replay(run, tmp_path, where):
    _, _, cfg, bag = run
    target = tmp_path / "jdir" if where == "a_directory" else tmp_path / "nowhere" / "s.json"
    if where == "a_directory":
        target.mkdir()
    _, res = replay(bag, "--config", cfg, "--json", target, expect=2)
    assert "--json" in res.stderr and "offline:" not in res.stderr  # refused before the bag was opened


def test_summary_json_file_matches_stdout(run, tmp_path):
    _, _, cfg, bag = run
    summary, res = replay(bag, "--config", cfg, "--json", tmp_path / "s.json")
    assert json.loads((tmp_path / "s.json").read_text()) == summary
