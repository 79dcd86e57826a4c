"""A replan's batched steps that append in place to the branches' own pages take no session lock: they go on
while another thread (a live step and its publishes) holds it, and their bytes are the serial ones."""
import threading

import numpy as np
import pytest

from conftest import CPU_BACKENDS, observation_trace, small_config
from flashrt_ros.runtime import Session

WAIT_S = 5.0  # only a broken build waits this long: every wait below ends on an event
BASE, HORIZON = 20, 24  # the branches' first step copies their partial page; the rest of the page is theirs
HELD_FROM, REACHED = 2, 20  # the lock is held from the 2nd batched step on; the 20th must still complete


@pytest.fixture(params=CPU_BACKENDS)
def backend(request) -> str:
    return request.param


def started(backend: str) -> Session:
    s = Session(small_config(), backend=backend)
    for o in observation_trace(BASE):
        s.step(o)
    return s


def branch_obs() -> np.ndarray:
    return np.random.default_rng(7).standard_normal((2, HORIZON, 14)).astype(np.float32)


def test_batched_steps_within_the_branches_own_pages_complete_while_another_thread_holds_the_session_lock(backend):
    s = started(backend)
    held, reached = threading.Event(), threading.Event()
    reached_while_held = []

    def holder():
        with s.lock:
            held.set()
            reached_while_held.append(reached.wait(WAIT_S))

    def on_step(done: int) -> None:
        if done == HELD_FROM:
            threading.Thread(target=holder, daemon=True).start()
            assert held.wait(WAIT_S)
        if done == REACHED:
            reached.set()

    res = s.replan(None, branch_obs(), commit_branch=0, on_step=on_step)

    assert reached_while_held == [True]
    assert res.steps_done == HORIZON and not res.cancelled
    serial = started(backend).replan(None, branch_obs(), commit_branch=0)
    assert res.actions.tobytes() == serial.actions.tobytes()
    assert s.state_host().tobytes() == started_after_commit(backend).tobytes()


def started_after_commit(backend: str) -> np.ndarray:
    s = started(backend)
    s.replan(None, branch_obs(), commit_branch=0)
    return s.state_host()
