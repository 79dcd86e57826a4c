"""flashrt-replay on real rosbag2 files (mcap and sqlite3), offline and through the live node."""
import json

import numpy as np
import pytest
from fixtures.make_bags import make_all
from fixtures.replay_cli import config_with, replay

from flashrt_ros.tools.replay.bags import StepRecord, read_policy_steps, typestore, write_outputs


@pytest.fixture(scope="module")
def bags(tmp_path_factory):
    return make_all(tmp_path_factory.mktemp("bags"))


@pytest.fixture(scope="module")
def cfg(tmp_path_factory):
    """The shipped config with a 64 MB store: its 512 MB took ~0.4 CPU-s to fault in per replay, and 1000 steps
    fit (test_single_file_bags_are_accepted replays with the shipped file itself: the same actions)."""
    return config_with(tmp_path_factory.mktemp("config"), capsule_budget_mb=64.0)


@pytest.fixture(scope="module")
def offline_run(bags, cfg, tmp_path_factory):
    out = tmp_path_factory.mktemp("out") / "offline"
    summary, _ = replay(bags["mcap"], "--config", cfg, "--out", out)
    return summary, out


def test_offline_replay_is_deterministic(bags, cfg, offline_run):
    first, _ = offline_run
    again, _ = replay(bags["mcap"], "--config", cfg)
    assert first["steps"] == first["messages"] == 1000 and first["rejected"]["count"] == 0
    assert again["actions_sha256"] == first["actions_sha256"]


def test_mcap_and_sqlite3_versions_give_identical_outputs(bags, cfg, offline_run, tmp_path):
    first, out_mcap = offline_run
    sq, _ = replay(bags["sqlite3"], "--config", cfg, "--out", tmp_path / "sq", "--storage", "sqlite3")
    assert sq["actions_sha256"] == first["actions_sha256"]
    _, res = replay("diff", out_mcap, tmp_path / "sq")
    assert json.loads(res.stdout)["identical"]


def test_single_file_bags_are_accepted(bags, offline_run):
    first, _ = offline_run
    one, _ = replay(next(bags["mcap"].glob("*.mcap")))  # no --config: the shipped file, its 512 MB store
    assert one["actions_sha256"] == first["actions_sha256"]


def test_rollback_checks_pass_over_a_whole_recorded_run(bags, cfg, offline_run):
    summary, _ = replay(bags["mcap"], "--config", cfg, "--rollback-every", 50, "--rollback-depth", 20)
    assert summary["rollback_checks"] == {"run": 20, "passed": 20}
    assert summary["actions_sha256"] == offline_run[0]["actions_sha256"]  # checks change nothing


def test_malformed_messages_are_counted_by_reason_with_their_numbers(bags, cfg):
    summary, _ = replay(bags["with_bad_messages"], "--config", cfg)
    assert summary["messages"] == 300 and summary["steps"] == 294 and summary["rejected"]["count"] == 6
    reasons = dict(summary["rejected"]["reasons"])
    assert reasons.pop("non-finite value nan at index 3") == 3
    # the 5-joint messages: refused by their size, or by their names where the node's converter (shared
    # with the replay) takes the joint order from the first message
    assert reasons in ({"JointState gives 5 positions + 5 velocities = 10 values, obs_dim is 14": 3},
                       {"JointState lacks joints ['joint5', 'joint6'] (has ['joint0', 'joint1', 'joint2', 'joint3', "
                        "'joint4'])": 3})


@pytest.mark.parametrize("name, message", [
    ("truncated", "cannot read bag"), ("corrupt", "cannot read bag"), ("empty", "holds no messages"),
    ("foreign", "no observation topic"), ("two_topics", "2 observation topics; pass --topic"),
    ("missing", "no such bag"),
])
def test_broken_bags_fail_cleanly_with_a_message(bags, name, message):
    _, res = replay(bags[name], expect=2)
    assert message in res.stderr and res.stdout == ""


def test_topic_of_a_foreign_type_is_refused(bags):
    _, res = replay(bags["foreign"], "--topic", "/chatter", expect=2)
    assert "has type std_msgs/msg/String" in res.stderr


def test_diff_finds_a_planted_divergence_at_the_exact_step(offline_run, tmp_path):
    _, out = offline_run
    ts = typestore()
    steps = read_policy_steps(out, ts)
    records = [StepRecord(m.header.stamp.sec * 10**9 + m.header.stamp.nanosec, m.step, m.capsule_id,
                          np.array(m.action, np.float32), np.array(m.action_chunk, np.float32), m.chunk_len,
                          m.step_latency_ms) for m in steps]
    records[617].action[3] += np.float32(1e-3)
    write_outputs(tmp_path / "planted", "mcap", records, ts)
    _, res = replay("diff", out, tmp_path / "planted", expect=1)
    report = json.loads(res.stdout)
    assert report["first_diverging_index"] == 617 and report["first_diverging_step"] == 618
    assert report["differing_steps"] == 1 and abs(report["max_abs_action_diff"] - 1e-3) < 1e-6
    assert "DIFFERENT" in res.stderr


@pytest.mark.ros
def test_live_replay_through_the_node_matches_offline_bytes(bags, cfg, offline_run, ros_domain, tmp_path):
    offline, out_offline = offline_run
    live, _ = replay(bags["mcap"], "--mode", "live", "--rate", 0, "--config", cfg, "--out", tmp_path / "live",
                     "--rollback-every", 250, "--rollback-depth", 20, env=ros_domain)
    assert live["steps"] == 1000 and live["actions_sha256"] == offline["actions_sha256"]
    assert live["rollback_checks"] == {"run": 4, "passed": 4}
    _, res = replay("diff", out_offline, tmp_path / "live")  # the node's own output reads back
    assert json.loads(res.stdout)["identical"]
    assert {m.header.frame_id for m in read_policy_steps(tmp_path / "live", typestore())} == {"base_link"}


def test_diff_reports_a_shorter_run_at_the_first_missing_step(offline_run, tmp_path):
    _, out = offline_run
    steps = read_policy_steps(out, typestore())
    records = [StepRecord(m.header.stamp.sec * 10**9 + m.header.stamp.nanosec, m.step, m.capsule_id,
                          np.array(m.action, np.float32), np.array(m.action_chunk, np.float32), m.chunk_len,
                          m.step_latency_ms, m.header.frame_id) for m in steps[:-1]]
    write_outputs(tmp_path / "short", "mcap", records, typestore())
    for a, b, n_a, n_b in ((out, tmp_path / "short", 1000, 999), (tmp_path / "short", out, 999, 1000)):
        _, res = replay("diff", a, b, expect=1)
        report = json.loads(res.stdout)
        assert (report["a_steps"], report["b_steps"], report["compared"]) == (n_a, n_b, 999)
        assert report["differing_steps"] == 0 and report["first_diverging_index"] == 999


def test_diff_finds_equal_actions_at_shifted_step_numbers_different(offline_run, tmp_path):
    _, out = offline_run
    steps = read_policy_steps(out, typestore())
    shifted = [StepRecord(m.header.stamp.sec * 10**9 + m.header.stamp.nanosec, m.step + 1, m.capsule_id,
                          np.array(m.action, np.float32), np.array(m.action_chunk, np.float32), m.chunk_len,
                          m.step_latency_ms, m.header.frame_id) for m in steps]
    write_outputs(tmp_path / "shifted", "mcap", shifted, typestore())
    _, res = replay("diff", out, tmp_path / "shifted", expect=1)
    report = json.loads(res.stdout)
    assert not report["identical"] and report["max_abs_action_diff"] == 0.0
    assert report["differing_steps"] == report["step_number_mismatches"] == 1000
    assert report["first_diverging_index"] == 0 and report["first_diverging_step"] == 1
    assert "1000 in step number" in res.stderr


def test_a_rollback_check_fails_when_the_re_fed_actions_differ_by_one_bit():
    from flashrt_ros.tools.replay.stream import RollbackChecks

    checks = RollbackChecks(every=4, depth=3)
    actions = [np.full(7, 0.25 * k, np.float32) for k in range(3)]
    for k, a in enumerate(actions):
        checks.push(k, a)
    checks.record([a.copy() for a in actions])
    planted = [a.copy() for a in actions]
    planted[1].view(np.uint32)[4] ^= 1  # one ulp in one joint of one step
    checks.record(planted)
    checks.record(actions[:2])  # a check that re-fed too few steps is a failure too
    assert (checks.run, checks.passed) == (3, 1)
