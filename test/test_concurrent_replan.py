"""A live step and a replan compute at the same time (the replan takes the session lock for its
bookkeeping only), and both come out byte for byte as when run one after the other."""
import threading
import time

import numpy as np
import pytest

from conftest import CPU_BACKENDS, WatchedLock, observation_trace, small_config
from flashrt_ros.runtime import Session

WAIT_S = 30  # only a broken build waits this long: every wait below ends on an event
PRE = 100  # live steps before the concurrent part; sources at 90, 100 and 120 (crossing the page at 128)
BRANCHES, HORIZON = 3, 12
LIVE_PER_REPLAN = 5  # live steps taken while each replan computes its second batched step


@pytest.fixture(params=CPU_BACKENDS)
def backend(request) -> str:
    return request.param


def config():
    return small_config(capsule_capacity=400)  # nothing is evicted: every capsule can be compared at the end


def started(trace, backend, upto: int = PRE) -> tuple[Session, dict[int, int]]:
    """A session after `upto` live steps, with the capsules of steps 90 and `upto` pinned: {step: capsule}."""
    s = Session(config(), backend=backend)
    sources = {}
    for i, o in enumerate(trace[:upto]):
        cid = s.step(o).capsule_id
        if i + 1 in (90, upto):
            sources[i + 1] = s.pin(cid).id
    return s, sources


def replan_obs(k: int) -> np.ndarray:
    rng = np.random.default_rng(100 + k)
    return rng.standard_normal((BRANCHES, HORIZON, 14)).astype(np.float32)


class Pacer:
    """Only the scheduling changes: each replan's second batched step, as it starts computing, lets the
    live thread step LIVE_PER_REPLAN observations and waits for them, so they complete while the branch
    rows compute (and fail to, when the compute holds the session lock)."""

    def __init__(self, s: Session):
        self.cond = threading.Condition()
        self.asked = self.done = self.replays = 0
        self.stop = False
        runner = s._branch_runner(BRANCHES)  # the one every replan of BRANCHES rows replays
        real = runner.replay

        def replay():
            self.replays += 1
            if self.replays % HORIZON == 2:
                with self.cond:
                    self.asked += LIVE_PER_REPLAN
                    self.cond.notify_all()
                    assert self.cond.wait_for(lambda: self.done >= self.asked, WAIT_S), \
                        "no live step completed while a batched replan step computed: it waited for it"
            real()
        runner.replay = replay

    def live(self, s: Session, obs, out: list) -> None:
        for o in obs:
            with self.cond:
                self.cond.wait_for(lambda: self.asked > self.done or self.stop)
                if self.asked <= self.done:
                    return
            res = s.step(o)
            out.append((res.action.tobytes(), res.chunk.tobytes(), res.capsule_id))
            with self.cond:
                self.done += 1
                self.cond.notify_all()


def run_threads(live, replans) -> None:
    errors = []

    def guarded(fn):
        def run():
            try:
                fn()
            except BaseException as e:  # noqa: BLE001 - re-raised below, on the test's thread
                errors.append(e)
        return run
    threads = [threading.Thread(target=guarded(f)) for f in (live, replans)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT_S * 2)
    assert not any(t.is_alive() for t in threads), "a thread hung"
    if errors:
        raise errors[0]


def test_live_steps_during_what_ifs_equal_their_serial_bytes_and_so_do_the_what_ifs(backend):
    trace = observation_trace(PRE + 200, seed=7)
    s, sources = started(trace, backend)
    s.step(trace[PRE])  # a third source: mid-page, its page crossed by the replans below
    sources[PRE + 1] = s.pin(s.live_capsule_id).id
    plan = [sources[(90, PRE, PRE + 1)[k % 3]] for k in range(6)]
    live_obs = trace[PRE + 1:PRE + 1 + len(plan) * LIVE_PER_REPLAN]
    pacer, live_out, results = Pacer(s), [], []

    def replans():
        try:
            for k, cid in enumerate(plan):
                res = s.replan(cid, replan_obs(k))
                results.append((res.actions.tobytes(), [s.capsule_host(c).tobytes() for c in res.branch_capsule_ids]))
        finally:
            with pacer.cond:
                pacer.stop = True
                pacer.cond.notify_all()

    run_threads(lambda: pacer.live(s, live_obs, live_out), replans)
    assert len(live_out) == len(live_obs) and len(results) == len(plan)

    live_ref, _ = started(trace, backend)  # the live timeline alone
    live_ref.step(trace[PRE])
    for (action, chunk, cid), o in zip(live_out, live_obs):
        res = live_ref.step(o)
        assert (action, chunk) == (res.action.tobytes(), res.chunk.tobytes()), f"live step {res.step}"
        assert s.capsule_host(cid).tobytes() == live_ref.capsule_host(res.capsule_id).tobytes(), f"step {res.step}"
    assert s.state_host().tobytes() == live_ref.state_host().tobytes()

    serial, _ = started(trace, backend)  # each replan alone on the same source capsule
    serial.step(trace[PRE])
    serial.pin(serial.live_capsule_id)
    for k, (cid, (actions, ends)) in enumerate(zip(plan, results)):
        res = serial.replan(cid, replan_obs(k))
        assert res.actions.tobytes() == actions, f"replan {k}"
        assert [serial.capsule_host(c).tobytes() for c in res.branch_capsule_ids] == ends, f"replan {k}"


def test_a_commit_during_live_steps_leaves_them_behind_and_continues_as_serially(backend):
    trace = observation_trace(PRE + 40, seed=8)
    s, sources = started(trace, backend)
    live_obs, after = trace[PRE:PRE + LIVE_PER_REPLAN], trace[PRE + 20:PRE + 30]
    pacer, live_out, out = Pacer(s), [], {}

    def replan():
        try:
            out["res"] = s.replan(sources[PRE], replan_obs(0), commit_branch=1)
        finally:
            with pacer.cond:
                pacer.stop = True
                pacer.cond.notify_all()

    run_threads(lambda: pacer.live(s, live_obs, live_out), replan)
    assert len(live_out) == LIVE_PER_REPLAN
    res = out["res"]
    assert s.step_count == PRE + HORIZON and s.live_capsule_id == res.branch_capsule_ids[1]
    got = [s.step(o).action.tobytes() for o in after]

    ref, ref_sources = started(trace, backend)
    for o in live_obs:
        ref.step(o)
    ref_res = ref.replan(ref_sources[PRE], replan_obs(0), commit_branch=1)
    assert ref_res.actions.tobytes() == res.actions.tobytes()
    assert [ref.step(o).action.tobytes() for o in after] == got
    assert ref.state_host().tobytes() == s.state_host().tobytes()


def test_a_reset_waits_for_a_running_replan_whose_branches_stay_byte_exact(backend):
    trace = observation_trace(PRE, seed=9)
    s, sources = started(trace, backend)
    s.branch_lock = WatchedLock(s.branch_lock)
    resetter = threading.Thread(target=s.reset)
    seen = []

    def on_step(done):
        if done == 1:
            resetter.start()
            seen.append(s.branch_lock.contended.wait(WAIT_S))  # reset reached the branch lock and waits
            seen.append(resetter.is_alive())

    res = s.replan(sources[PRE], replan_obs(0), on_step=on_step)
    resetter.join(WAIT_S)
    assert seen == [True, True], "reset ran in the middle of a replan, under its branch rows"
    assert s.step_count == 0

    ref, ref_sources = started(trace, backend)
    assert ref.replan(ref_sources[PRE], replan_obs(0)).actions.tobytes() == res.actions.tobytes()


# Calls that take pages the replan's room check counted as free or evictable (a pin, an import's window,
# an export's held pages, a cold baseline's fresh window) wait for it, as reset does.
PAGE_TAKERS = {
    "pin": lambda s, src, tmp: s.pin(src),
    "pinned_snapshot": lambda s, src, tmp: s.snapshot("kept", pin=True),
    "export": lambda s, src, tmp: s.export_capsule(src, tmp / "out.safetensors"),
    "import": lambda s, src, tmp: s.import_capsule(tmp / "in.safetensors"),
    "cold_prefill": lambda s, src, tmp: s.cold_prefill(),
}


@pytest.mark.parametrize("call", sorted(PAGE_TAKERS))
def test_calls_that_take_pages_wait_for_a_running_replan_whose_branches_stay_byte_exact(backend, call, tmp_path):
    trace = observation_trace(PRE, seed=9)
    s, sources = started(trace, backend)
    s.export_capsule(sources[90], tmp_path / "in.safetensors")
    unpinned = next(c.id for c in s.list_capsules() if not c.pinned)
    s.branch_lock = WatchedLock(s.branch_lock)
    caller = threading.Thread(target=PAGE_TAKERS[call], args=(s, unpinned, tmp_path))
    seen = []

    def on_step(done):
        if done == 1:
            caller.start()
            seen.append(s.branch_lock.contended.wait(WAIT_S))  # the call reached the branch lock and waits
            seen.append(caller.is_alive())

    res = s.replan(sources[PRE], replan_obs(0), on_step=on_step)
    caller.join(WAIT_S)
    assert seen == [True, True], f"{call} ran in the middle of a replan, with pages its room check counted"
    assert not caller.is_alive()
    if call == "pin":
        assert s.capsule_info(unpinned).pinned
    ref, ref_sources = started(trace, backend)
    assert ref.replan(ref_sources[PRE], replan_obs(0)).actions.tobytes() == res.actions.tobytes()


def test_a_call_that_waits_for_replans_raises_from_inside_a_step_instead_of_deadlocking(backend):
    s, _ = started(observation_trace(PRE, seed=9), backend, upto=10)
    with pytest.raises(RuntimeError, match="outside the step"):
        s.step(observation_trace(1, seed=3)[0], on_action=lambda action: s.reset())


def test_a_replan_from_inside_a_step_raises_instead_of_deadlocking_with_another_threads_replan(backend):
    trace = observation_trace(PRE + 1, seed=9)
    s, sources = started(trace, backend)
    inside, errors = threading.Event(), []

    def on_step(done):  # the other thread's replan holds branch_lock while the step below runs
        if done == 1:
            inside.set()
            time.sleep(0.3)
    other = threading.Thread(target=lambda: s.replan(sources[PRE], replan_obs(0), on_step=on_step))
    other.start()
    assert inside.wait(WAIT_S)

    def replan_in_step(action):
        try:
            s.replan(None, replan_obs(1))
        except RuntimeError as e:
            errors.append(str(e))
    s.step(trace[PRE], on_action=replan_in_step)
    other.join(WAIT_S)
    assert not other.is_alive() and errors and "outside the step" in errors[0]


@pytest.mark.parametrize("call", ["reset", "replan", "import"])
def test_a_call_that_waits_for_replans_raises_from_inside_a_replans_own_callback(backend, call, tmp_path):
    """branch_lock is re-entrant: from the replan's own thread such a call ran in the middle of it, rewrote its
    branch rows (the answer still said ok) and, for a reset under a commit, left the live row inconsistent."""
    trace = observation_trace(PRE, seed=9)
    s, sources = started(trace, backend)
    s.export_capsule(sources[PRE], tmp_path / "c.safetensors")
    calls = {"reset": s.reset, "replan": lambda: s.replan(None, replan_obs(1)),
             "import": lambda: s.import_capsule(tmp_path / "c.safetensors")}
    errors = []

    def on_step(done):
        if done == 2:
            try:
                calls[call]()
            except RuntimeError as e:
                errors.append(str(e))
    before = s.state_host().tobytes(), s.step_count
    res = s.replan(sources[PRE], replan_obs(0), on_step=on_step)
    assert errors and "from inside it" in errors[0]
    assert (s.state_host().tobytes(), s.step_count) == before  # a what-if: the live row as it was
    ref, ref_sources = started(trace, backend)
    assert ref.replan(ref_sources[PRE], replan_obs(0)).actions.tobytes() == res.actions.tobytes()


def test_without_concurrent_replay_batched_steps_compute_under_the_lock_and_live_steps_run_between_them():
    """The CUDA path (one stream, bound graphs), run here on NumPy with concurrent_replay off."""
    trace = observation_trace(PRE + 1, seed=9)
    s, sources = started(trace, "numpy")
    s.backend.concurrent_replay = False
    runner = s._branch_runner(BRANCHES)
    real, under_lock = runner.replay, []

    def replay():
        under_lock.append(s.lock._is_owned())
        real()
    runner.replay = replay
    live = []

    def on_step(done):
        if done == 1:  # between two batched steps a live step gets the lock
            t = threading.Thread(target=lambda: live.append(s.step(trace[PRE])))
            t.start()
            t.join(WAIT_S)
    res = s.replan(sources[PRE], replan_obs(0), on_step=on_step)
    assert under_lock == [True] * HORIZON
    assert len(live) == 1 and s.step_count == PRE + 1
    ref, ref_sources = started(trace, "numpy")
    assert ref.replan(ref_sources[PRE], replan_obs(0)).actions.tobytes() == res.actions.tobytes()
    assert ref.step(trace[PRE]).action.tobytes() == live[0].action.tobytes()
