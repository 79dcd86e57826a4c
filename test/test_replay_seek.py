"""Bags with the capsule stream (issue 18, point 4): `flashrt-replay --out` records the run's capsule records
beside its actions, and `--from SECONDS` enters a bag in the middle from them: the last keyframe before that
time, the records up to it, then the observations after it, byte-identical to the full replay from the same
step, reading only the records of that stretch."""
from __future__ import annotations

import numpy as np
import pytest
from fixtures.make_bags import T0_NS, trace, write_joint_messages
from fixtures.replay_cli import TINY_CONFIG, config_with, replay

from flashrt_ros.runtime.persist.format import DELTA, RESYNC
from flashrt_ros.tools.replay.bags import iter_capsule_records, read_policy_steps, typestore

N = 600  # 6 s at 100 Hz; a keyframe every 0.5 s of bag time: 12 keyframes


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("seek")
    bag = write_joint_messages(tmp / "in", trace(N), [T0_NS + i * 10_000_000 for i in range(N)])
    cfg = config_with(tmp, base=TINY_CONFIG.replace("capsule_capacity: 4", "capsule_capacity: 64"),
                      stream_keyframe_s=0.5)
    summary, _ = replay(bag, "--config", cfg, "--out", tmp / "full")
    return tmp, bag, cfg, summary


def _steps(path):
    return {int(m.step): np.asarray(m.action, np.float32).tobytes() for m in read_policy_steps(path, typestore())}


def test_out_records_every_step_as_a_capsule_record_with_a_keyframe_every_half_second(recorded):
    tmp, _, _, summary = recorded
    records = [m for _, m in iter_capsule_records(tmp / "full", typestore())]
    assert [int(m.step) for m in records] == list(range(1, N + 1)) == sorted(_steps(tmp / "full"))
    assert [int(m.seq) for m in records] == list(range(1, N + 1))
    keys = [int(m.step) for m in records if m.kind == RESYNC]
    assert keys[0] == 1 and 10 <= len(keys) <= 13 and all(b - a <= 51 for a, b in zip(keys, keys[1:])), keys
    assert all(m.kind in (DELTA, RESYNC) for m in records)


@pytest.mark.parametrize("from_s", [0.005, 2.345, 4.2, 5.99])
def test_from_enters_the_bag_mid_run_byte_identical_to_the_full_replay(recorded, tmp_path, from_s):
    tmp, bag, cfg, _ = recorded
    summary, _ = replay(bag, "--config", cfg, "--from", from_s, "--stream", tmp / "full", "--out", tmp_path / "part")
    first = -(-round(from_s * 1e9) // 10_000_000) + 1  # the step of the first observation at or after --from
    assert summary["from"]["restored_step"] == first - 1
    full, part = _steps(tmp / "full"), _steps(tmp_path / "part")
    assert sorted(part) == list(range(first, N + 1))
    assert all(part[s] == full[s] for s in part), "a step after --from differs from the full replay"
    # only the stretch before --from was read: one keyframe interval and the slack (1.5 s: 150 records)
    assert summary["from"]["records_read"] <= 151 and summary["from"]["records_applied"] <= 51


def test_from_a_bag_whose_stream_was_written_by_another_config_is_refused_with_the_reason(recorded, tmp_path):
    tmp, bag, _, _ = recorded
    other = config_with(tmp_path, base=TINY_CONFIG.replace("capsule_capacity: 4", "capsule_capacity: 64"), seed=3)
    _, res = replay(bag, "--config", other, "--from", 3.0, "--stream", tmp / "full", expect=2)
    assert "fingerprint" in res.stderr and "refused" in res.stderr, res.stderr


def test_from_without_a_stream_in_the_bag_says_where_to_get_one(recorded):
    _, bag, cfg, _ = recorded
    _, res = replay(bag, "--config", cfg, "--from", 3.0, expect=2)
    assert "no flashrt_interfaces/msg/CapsuleRecord topic" in res.stderr and "--out" in res.stderr, res.stderr
