"""flashrt-replay reads what is in the storage, not what metadata.yaml claims, and streams: its memory
does not grow with the length of the bag."""
import numpy as np
import pytest
import yaml
from fixtures.make_bags import JOINTS, T0_NS, trace, write_joint_messages
from fixtures.replay_cli import TINY_CONFIG, config_with, replay


def rewrite_metadata(bag, edit) -> None:
    path = bag / "metadata.yaml"
    doc = yaml.safe_load(path.read_text())
    edit(doc["rosbag2_bagfile_information"])
    path.write_text(yaml.safe_dump(doc))


@pytest.fixture
def hundred(tmp_path, request):
    storage = getattr(request, "param", "mcap")
    bag = write_joint_messages(tmp_path / "in", trace(100), [T0_NS + i * 10_000_000 for i in range(100)],
                               storage=storage)
    return bag, config_with(tmp_path, base=TINY_CONFIG)


@pytest.mark.parametrize("hundred", ["mcap", "sqlite3"], indirect=True)
def test_a_message_count_of_zero_in_metadata_does_not_hide_the_messages(hundred, tmp_path):
    bag, cfg = hundred
    clean, _ = replay(bag, "--config", cfg)

    def zero_counts(info):
        info["message_count"] = 0
        for t in info["topics_with_message_count"]:
            t["message_count"] = 0
        for f in info["files"]:
            f["message_count"] = 0
    rewrite_metadata(bag, zero_counts)
    summary, _ = replay(bag, "--config", cfg)
    assert summary["messages"] == summary["steps"] == 100
    assert summary["actions_sha256"] == clean["actions_sha256"]


@pytest.mark.parametrize("hundred", ["mcap", "sqlite3"], indirect=True)
def test_a_rewritten_topic_type_in_metadata_is_overruled_by_the_storage(hundred):
    bag, cfg = hundred
    clean, _ = replay(bag, "--config", cfg)

    def retype(info):
        info["topics_with_message_count"][0]["topic_metadata"]["type"] = "std_msgs/msg/Float32MultiArray"
    rewrite_metadata(bag, retype)
    summary, res = replay(bag, "--config", cfg)
    assert summary["steps"] == 100 and summary["actions_sha256"] == clean["actions_sha256"]
    assert summary["metadata_mismatch"] == ["metadata.yaml says /joint_states is std_msgs/msg/Float32MultiArray, "
                                            "the storage says sensor_msgs/msg/JointState: using the storage"]
    assert "warning: metadata.yaml says" in res.stderr


@pytest.mark.parametrize("field, value", [("compression_mode", None), ("compression_mode", 7),
                                          ("relative_file_paths", [7]), ("relative_file_paths", "x.mcap")])
def test_a_wrongly_typed_metadata_field_is_ignored_and_the_storage_replays(hundred, field, value):
    bag, cfg = hundred
    clean, _ = replay(bag, "--config", cfg)

    def mistype(info):
        info[field] = value
    rewrite_metadata(bag, mistype)
    summary, _ = replay(bag, "--config", cfg)  # exit 0, not 4 (a crash)
    assert summary["steps"] == 100 and summary["actions_sha256"] == clean["actions_sha256"]


def test_a_missing_metadata_yaml_still_replays_the_storage(hundred):
    bag, cfg = hundred
    (bag / "metadata.yaml").unlink()
    summary, _ = replay(bag, "--config", cfg)
    assert summary["steps"] == 100


def _long_bag(path, n: int):
    """n JointState messages at 100 Hz, written with rosbags (no ROS tooling)."""
    from rosbags.rosbag2 import StoragePlugin, Writer
    from rosbags.typesys import Stores, get_typestore

    ts = get_typestore(Stores.ROS2_HUMBLE)
    T = ts.types
    j = np.arange(7)
    with Writer(path, version=9, storage_plugin=StoragePlugin.MCAP) as w:
        conn = w.add_connection("/joint_states", "sensor_msgs/msg/JointState", typestore=ts)
        for i in range(n):
            ns = T0_NS + i * 10_000_000
            header = T["std_msgs/msg/Header"](stamp=T["builtin_interfaces/msg/Time"](sec=ns // 10**9,
                                                                                  nanosec=ns % 10**9),
                                              frame_id="base_link")
            msg = T["sensor_msgs/msg/JointState"](header=header, name=JOINTS, position=np.sin(0.01 * i + j),
                                                  velocity=np.cos(0.01 * i + j), effort=np.zeros(0))
            w.write(conn, ns, ts.serialize_cdr(msg, "sensor_msgs/msg/JointState"))
    return path


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


@pytest.mark.skipif(not __import__("os").path.exists("/proc/self/statm"), reason="needs Linux /proc")
def test_memory_does_not_grow_with_the_length_of_the_bag(tmp_path, monkeypatch, capsys):
    """5e4 messages replayed offline into an output bag; resident memory sampled at every progress line
    (every 2000 messages) stays flat after warm-up. Keeping ~1 KB per step, as the old list of records did,
    grows it by ~40 MB from message 10k on (90 MB over 1e5 messages, the test's length until 2026-12-05)."""
    from flashrt_ros.tools.replay import cli as replay_mod

    n = 50_000
    bag = _long_bag(tmp_path / "long", n)
    cfg = config_with(tmp_path, base=TINY_CONFIG)
    samples = []
    monkeypatch.setattr(replay_mod, "progress", lambda msg: samples.append(_rss_bytes()))
    rc = replay_mod.main([str(bag), "--config", str(cfg), "--out", str(tmp_path / "out")])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert '"steps": 50000' in out
    assert len(samples) >= 25  # one per 2000 messages, plus the start line
    after_warmup = samples[5:]  # 10k messages in: allocator pools and the output writer are at size
    growth_mb = (max(after_warmup) - after_warmup[0]) / 2**20
    assert growth_mb < 12, f"RSS grew {growth_mb:.1f} MiB from message 10k to 50k"


def test_a_flood_of_distinct_reject_reasons_takes_bounded_memory():
    from flashrt_ros.tools.replay.stream import Rejections

    r = Rejections()
    for i in range(10_000):
        r.add(f"non-finite value inf at index {i}")
    r.add("non-finite value inf at index 3")  # a reason seen before keeps its exact key
    s = r.summary()
    assert s["count"] == 10_001 and len(s["reasons"]) == Rejections.MAX_DISTINCT + 1
    assert s["reasons"]["non-finite value inf at index 3"] == 2
    assert s["reasons"]["non-finite value inf at index N (numbers vary)"] == 10_000 - Rejections.MAX_DISTINCT
