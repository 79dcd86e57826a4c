"""How the stream bench judges one failover pair (flashrt_ros/tools/bench/stream_failover.judge_pair), ROS-free:
a primary's own drop before its kill is told apart from an observation the takeover left unstepped, and a
step is compared with a reference that stepped exactly the observations the pair stepped."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from conftest import observation_trace, small_config
from flashrt_ros.runtime import Session
from flashrt_ros.tools.bench.stream_failover import _explain, _role_events, judge_pair

KILLED_AT = 100.0  # monotonic seconds of the kill
STANDBY_FROM = KILLED_AT + 0.05  # a step received from then on is the standby's


def _step(number: int, stamp_ns: int, action: np.ndarray, arrived: float):
    stamp = SimpleNamespace(sec=stamp_ns // 10**9, nanosec=stamp_ns % 10**9)
    return arrived, SimpleNamespace(step=number, header=SimpleNamespace(stamp=stamp),
                                    action=action.astype(np.float32).tolist())


def _pair(observations, stepped: list[int], primary_steps: int, restepped: int = 0, late_ms: float = 0.0):
    """The PolicySteps of a pair that stepped the observations ``stepped`` (indices, in order): the first
    ``primary_steps`` of them by the primary, its last one received ``late_ms`` after the kill (sent before it);
    the rest by the standby, which steps the primary's last ``restepped`` again first (from an older capsule)."""
    sent = [10**9 * (i + 1) + 7 for i in range(len(observations))]
    live = Session(small_config())
    steps, actions = [], []
    for n, i in enumerate(stepped, start=1):
        actions.append(live.step(observations[i]).action)
        if n <= primary_steps:
            arrived = KILLED_AT + late_ms / 1e3 if n == primary_steps and late_ms else KILLED_AT - 1.0 + n * 1e-3
            steps.append(_step(n, sent[i], actions[-1], arrived))
    for n in range(primary_steps - restepped + 1, len(stepped) + 1):
        steps.append(_step(n, sent[stepped[n - 1]], actions[n - 1], KILLED_AT + 0.2 + n * 1e-3))
    return steps, sent


def _judge(steps, sent, observations):
    return judge_pair(steps, sent, observations, STANDBY_FROM, Session(small_config()))


def test_an_uncrashed_looking_pair_has_nothing_to_report():
    obs = observation_trace(12)
    steps, sent = _pair(obs, list(range(12)), primary_steps=8)
    assert _judge(steps, sent, obs) == {"dropped_before_kill": [], "unstepped": [], "different": []}


def test_a_primary_drop_before_its_kill_is_its_own_and_the_rest_still_compares_equal():
    obs = observation_trace(12)
    stepped = [i for i in range(12) if i not in (3, 4)]  # its queue overflowed: 4th and 5th never stepped
    steps, sent = _pair(obs, stepped, primary_steps=6)
    assert _judge(steps, sent, obs) == {"dropped_before_kill": [4, 5], "unstepped": [], "different": []}


def test_an_observation_the_takeover_skipped_is_unstepped_not_a_primary_drop():
    obs = observation_trace(12)
    stepped = [i for i in range(12) if i != 9]  # after the primary's last step (index 7): the standby's to step
    steps, sent = _pair(obs, stepped, primary_steps=8)
    assert _judge(steps, sent, obs)["unstepped"] == [10]
    assert _judge(steps, sent, obs)["dropped_before_kill"] == []


def test_steps_the_standby_repeats_from_an_older_capsule_leave_the_primarys_drop_its_own():
    obs = observation_trace(12)
    stepped = [i for i in range(12) if i != 4]
    steps, sent = _pair(obs, stepped, primary_steps=6, restepped=2)  # the standby re-steps the 6th and 7th sent
    assert _judge(steps, sent, obs) == {"dropped_before_kill": [5], "unstepped": [], "different": []}


def test_a_primary_step_received_just_after_the_kill_is_still_the_primarys():
    obs = observation_trace(12)
    stepped = [i for i in range(12) if i != 5]
    steps, sent = _pair(obs, stepped, primary_steps=6, late_ms=3.0)  # its step of the 7th sent, received late
    assert _judge(steps, sent, obs) == {"dropped_before_kill": [6], "unstepped": [], "different": []}


def test_stamps_and_observations_of_another_length_are_refused():
    obs = observation_trace(12)
    steps, sent = _pair(obs, list(range(12)), primary_steps=8)
    with pytest.raises(ValueError, match="11 stamps sent for 12 observations"):
        _judge(steps, sent[:11], obs)


@pytest.mark.parametrize("harm", ["action", "step_number"])
def test_a_step_off_the_reference_is_different(harm):
    obs = observation_trace(12)
    steps, sent = _pair(obs, list(range(12)), primary_steps=8)
    t, m = steps[9]
    if harm == "action":
        m.action = [m.action[0] + 1e-6, *m.action[1:]]
    else:  # one step more than observations stepped
        steps.append((t + 1.0, SimpleNamespace(step=13, header=m.header, action=m.action)))
    assert _judge(steps, sent, obs)["different"] == [13 if harm == "step_number" else 10]


def test_a_step_under_a_stamp_never_sent_leaves_its_observation_unstepped_and_differs():
    obs = observation_trace(12)
    steps, sent = _pair(obs, list(range(12)), primary_steps=8)
    steps[9][1].header.stamp.nanosec += 1  # the standby's 10th step names no observation sent
    judged = _judge(steps, sent, obs)
    assert judged["unstepped"] == [10] and judged["different"][0] == 10


def test_a_standby_that_continued_from_the_wrong_capsule_differs_from_there_on():
    obs = observation_trace(12)
    steps, sent = _pair(obs, list(range(12)), primary_steps=8)
    # the standby's steps 9.. computed as if it had missed observation 8 (a stale capsule)
    stale = Session(small_config())
    actions = [stale.step(o).action for i, o in enumerate(obs) if i != 7]
    steps = steps[:8] + [_step(n, sent[n - 1], actions[n - 2], KILLED_AT + 0.2) for n in range(9, 13)]
    assert _judge(steps, sent, obs)["different"] == [9, 10, 11, 12]


def test_a_failed_kill_reports_whether_its_first_different_step_slipped_a_number_or_diverged():
    obs = observation_trace(12)
    steps, sent = _pair(obs, list(range(12)), primary_steps=8)
    # the standby's 10th step names observation 11 and carries its right action (a numbering slip), its
    # 11th names observation 11 with an action off by one ulp (the state diverged)
    t, m = steps[9]
    slip = _step(10, sent[10], np.asarray(steps[10][1].action, np.float32), t)
    t, m = steps[10]
    harmed = _step(11, sent[10], np.nextafter(np.asarray(m.action, np.float32), np.float32(9)), t)
    steps = steps[:9] + [slip, harmed] + steps[11:]
    assert _judge(steps, sent, obs)["different"][:2] == [10, 11]
    report = _explain([10, 11], steps, sent, obs, small_config(), "numpy", STANDBY_FROM)
    assert report == [
        {"step": 10, "by": "standby", "observation": 11, "action_is_the_references_for_it": True},
        {"step": 11, "by": "standby", "observation": 11, "action_is_the_references_for_it": False}]
    assert _explain([], steps, sent, obs, small_config(), "numpy", STANDBY_FROM) == []


def test_a_failed_kills_log_lines_are_the_pairs_role_changes_only(tmp_path):
    (tmp_path / "fo0.log").write_text(
        "[WARN] [fo0.flashrt]: joint_names is unset: ... refuse messages from a publisher with other joints\n"
        "[ERROR] [fo0.flashrt]: deposed: /fo0_standby/flashrt leads the robot since epoch 2\n")
    (tmp_path / "fo0_standby.log").write_text(
        "[INFO] [fo0_standby.flashrt]: configure: done\n"
        "[ERROR] [fo0_standby.flashrt]: capsule record 7 from /fo0/flashrt refused: a gap\n"
        "[WARN] [fo0_standby.flashrt]: took over from /fo0/flashrt (epoch 2)\n")
    assert [line.split(": ", 2)[-1] for line in _role_events(tmp_path, "/fo0")] == [
        "deposed: /fo0_standby/flashrt leads the robot since epoch 2",
        "capsule record 7 from /fo0/flashrt refused: a gap", "took over from /fo0/flashrt (epoch 2)"]
    assert _role_events(tmp_path, "/fo1") == []  # no logs: nothing, not an error
