"""replan_threads: the compiled CPU step splits a replan's rows over threads, and every branch comes out
byte for byte as on one thread (no reduction crosses rows), beside live steps too."""
import os
import threading
import time

import numpy as np
import pytest

from conftest import observation_trace, small_config
from flashrt_ros.runtime import PolicyConfig, Session
from flashrt_ros.runtime.engine.cpu_backend import SplitReplay, _nice, row_parts

PRE = 150  # live steps before the replans: a kv_window of 96 wrapped, its pages crossed more than once
HORIZON = 10


def session(threads: int) -> Session:
    return Session(small_config(kv_window=96, replan_threads=threads, capsule_capacity=300), backend="cpu")


def started(threads: int, trace) -> tuple[Session, int]:
    s = session(threads)
    for o in trace[:PRE]:
        s.step(o)
    return s, s.snapshot(pin=True).id


def branch_bytes(s: Session, source: int, obs: np.ndarray) -> list[bytes]:
    """Actions and every branch's end-state capsule of one replan, as bytes."""
    r = s.replan(source, obs)
    assert r.steps_done == obs.shape[1]
    return [r.actions.tobytes()] + [s.capsule_host(c).tobytes() for c in r.branch_capsule_ids]


def plans(rows_list) -> list[np.ndarray]:
    rng = np.random.default_rng(7)
    return [rng.standard_normal((rows, HORIZON, 14)).astype(np.float32) for rows in rows_list]


@pytest.mark.parametrize("count, threads", [(1, 2), (2, 2), (3, 2), (4, 2), (8, 2), (5, 3), (8, 4), (2, 9)])
def test_row_parts_cover_every_row_once_in_contiguous_parts(count, threads):
    parts = row_parts(count, threads)
    assert len(parts) == min(count, threads)
    assert [r for first, n in parts for r in range(first, first + n)] == list(range(count))
    assert max(n for _, n in parts) - min(n for _, n in parts) <= 1


def test_a_replan_split_over_threads_is_byte_identical_to_one_thread():
    trace = observation_trace(PRE)
    rows_list = (1, 2, 3, 4, 5, 8)  # parts of 1, 2, 3 and 4 rows: every row block of the compiled GEMV
    want_s, want_src = started(1, trace)
    want = [branch_bytes(want_s, want_src, p) for p in plans(rows_list)]
    for threads in (2, 3):
        s, src = started(threads, trace)
        assert isinstance(s._branch_runner(4), SplitReplay)
        got = [branch_bytes(s, src, p) for p in plans(rows_list)]
        for rows, g, w in zip(rows_list, got, want):
            assert g == w, f"{rows} rows on {threads} threads differ from one thread"


def test_a_split_replan_beside_live_steps_matches_both_serial_runs():
    trace = observation_trace(PRE + 40)
    (plan,) = plans((4,))
    serial, src = started(1, trace)
    want_replan = branch_bytes(serial, src, plan)
    want_live = [serial.step(o).action.tobytes() for o in trace[PRE:]]

    s, src = started(2, trace)
    got_live, got_replan, errors = [], [], []

    def live():
        try:
            got_live.extend(s.step(o).action.tobytes() for o in trace[PRE:])
        except Exception as e:  # noqa: BLE001  reported below, not lost in the thread
            errors.append(e)

    def replans():
        try:
            got_replan.extend(branch_bytes(s, src, plan))
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=live), threading.Thread(target=replans)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    assert got_live == want_live and got_replan == want_replan


def test_replan_threads_below_one_is_refused_with_its_name():
    with pytest.raises(ValueError, match="replan_threads: must be >= 1"):
        PolicyConfig(replan_threads=0)


class Part:
    """A stand-in part: records its thread's nice value; waits at a barrier all parts must reach together (so
    parts replayed one after another never pass it), or sleeps, or raises."""

    def __init__(self, log, barrier=None, sleep_s=0.0, fail=False, rows=1):
        self.log, self.barrier, self.sleep_s, self.fail, self.rows = log, barrier, sleep_s, fail, rows

    def replay(self):
        self.log.append(("start", threading.get_ident(), _nice()))
        if self.fail:
            raise RuntimeError("part failed")
        if self.barrier is not None:
            self.barrier.wait(timeout=10)
        time.sleep(self.sleep_s)
        self.log.append(("end", threading.get_ident(), _nice()))


def test_split_parts_run_at_the_same_time_on_other_threads_at_the_callers_nice_value():
    log, barrier = [], threading.Barrier(3)
    nice = min(19, _nice() + 3)
    result = {}

    def caller():
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), nice)
        SplitReplay([Part(log, barrier) for _ in range(3)]).replay()
        result["nice"] = _nice()

    t = threading.Thread(target=caller)
    t.start()
    t.join(30)
    starts = [e for e in log if e[0] == "start"]
    assert len(starts) == 3 and len({e[1] for e in starts}) == 3  # three threads, all through the barrier
    assert {e[2] for e in starts} == {result["nice"]} == {nice}


def test_a_failing_part_is_raised_after_every_other_part_has_ended():
    log = []
    parts = [Part(log), Part(log, fail=True), Part(log, sleep_s=0.3)]  # the slow part is waited for last
    with pytest.raises(RuntimeError, match="part failed"):
        SplitReplay(parts).replay()
    assert [e[0] for e in log].count("end") == 2, log  # its rows are free only once it has ended


def test_a_replan_threads_below_one_set_on_a_session_is_refused_and_the_next_replan_unchanged():
    trace = observation_trace(PRE)
    s, src = started(2, trace)
    (plan,) = plans((4,))
    with pytest.raises(ValueError, match="replan_threads: must be an int >= 1, got 0"):
        s.replan_threads = 0
    assert s.replan_threads == 2
    want_s, want_src = started(1, trace)
    assert branch_bytes(s, src, plan) == branch_bytes(want_s, want_src, plan)
