"""How the stream bench judges one failover pair (flashrt_ros/tools/bench/stream_failover.judge_pair), ROS-free:
a primary's own drop before its kill is told apart from an observation the takeover left unstepped, and a
step is compared with a reference that stepped exactly the observations the pair stepped."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from conftest import observation_trace, small_config
from flashrt_ros.runtime import Session
from flashrt_ros.tools.bench.stream_failover import judge_pair

KILLED_AT = 100.0  # monotonic seconds of the kill; the primary's steps arrive before, the standby's after


def _step(number: int, stamp_ns: int, action: np.ndarray, arrived: float):
    stamp = SimpleNamespace(sec=stamp_ns // 10**9, nanosec=stamp_ns % 10**9)
    return arrived, SimpleNamespace(step=number, header=SimpleNamespace(stamp=stamp),
                                    action=action.astype(np.float32).tolist())


def _pair(observations, stepped: list[int], primary_steps: int):
    """The PolicySteps of a pair that stepped the observations ``stepped`` (indices, in order); the first
    ``primary_steps`` of them by the primary (before the kill), the rest by the standby."""
    sent = [10**9 * (i + 1) + 7 for i in range(len(observations))]
    live = Session(small_config())
    steps = []
    for n, i in enumerate(stepped, start=1):
        arrived = KILLED_AT - 1.0 + n * 1e-3 if n <= primary_steps else KILLED_AT + 0.2 + n * 1e-3
        steps.append(_step(n, sent[i], live.step(observations[i]).action, arrived))
    return steps, sent


def _judge(steps, sent, observations):
    return judge_pair(steps, sent, observations, KILLED_AT, Session(small_config()))


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
