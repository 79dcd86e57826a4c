"""Session API contracts a planner author relies on (issue: hardening): a failed operation changes
nothing, the lock guards every store operation, and "none" is spelled None."""
import threading

import numpy as np
import pytest

from conftest import CPU_BACKENDS, assert_refused_unchanged, observation_trace, small_config
from flashrt_ros.runtime import CapsuleInUse, Session, StoreFullOfPins, UnknownCapsule


@pytest.fixture(params=CPU_BACKENDS)
def stepped(request) -> Session:
    """30 steps in, a capsule after each, on each CPU backend."""
    s = Session(small_config(), backend=request.param)
    for o in observation_trace(30):
        s.step(o)
    return s


@pytest.mark.parametrize("value", [1e300, -1e39, 3.5e38])
def test_a_value_that_overflows_float32_is_rejected_before_it_reaches_the_state(stepped, value):
    obs = np.zeros(14)
    obs[3] = value  # finite as float64, inf as float32
    assert_refused_unchanged(stepped, lambda: stepped.step(obs), ValueError, "non-finite.*index 3")
    assert_refused_unchanged(stepped, lambda: stepped.replan(0, np.full((1, 2, 14), value)), ValueError, "non-finite")


def test_the_live_capsule_cannot_be_dropped_and_steps_back_still_walks_the_lineage(stepped):
    assert_refused_unchanged(stepped, lambda: stepped.drop(stepped.live_capsule_id), CapsuleInUse, "live capsule")
    assert stepped.rollback(steps_back=5).step == 25
    stepped.drop(20)  # any other capsule can go
    with pytest.raises(UnknownCapsule, match="dropped"):
        stepped.rollback(20)


def test_rollback_by_id_and_steps_back_goes_back_along_that_capsules_lineage(stepped):
    assert stepped.rollback(capsule_id=20, steps_back=5).step == 15
    assert stepped.step_count == 15 and stepped.live_capsule_id == 15
    assert_refused_unchanged(stepped, lambda: stepped.rollback(capsule_id=10, steps_back=11), UnknownCapsule,
                             "before step 0")
    assert_refused_unchanged(stepped, lambda: stepped.rollback(steps_back=-1), ValueError, "steps_back")


def test_replan_without_a_deadline_runs_every_step(stepped):
    obs = np.repeat(observation_trace(300)[None], 2, axis=0)
    res = stepped.replan(None, obs)  # the library default: no deadline
    assert res.steps_done == 300 and res.actions.shape == (2, 300, 7) and res.deadline_met


def test_a_cancelled_replan_never_commits_even_when_asked_to(stepped):
    before, live = stepped.state_host().tobytes(), stepped.live_capsule_id
    calls = []
    res = stepped.replan(0, np.ones((2, 6, 14), np.float32), commit_branch=1,
                         cancel=lambda: len(calls) >= 3, on_step=calls.append)
    assert res.cancelled and res.steps_done == 3 and "nothing committed" in res.message
    assert stepped.state_host().tobytes() == before and stepped.live_capsule_id == live


def test_labels_are_bounded(stepped):
    assert_refused_unchanged(stepped, lambda: stepped.snapshot(label="x" * 257), ValueError, "label")
    assert stepped.snapshot(label="x" * 256).label == "x" * 256


def test_store_operations_from_many_threads_never_see_a_changing_store():
    """list, snapshot, drop and replan from several threads at once while the live policy steps."""
    s = Session(small_config(capsule_capacity=40, max_branches=2))
    obs = observation_trace(2000)
    errors, stop = [], threading.Event()

    def guard(fn):
        def run():
            try:
                while not stop.is_set():
                    fn()
            except Exception as e:  # noqa: BLE001 - any escape is the failure this test looks for
                errors.append(e)
        return run

    def lister():
        ids = [c.id for c in s.list_capsules()]
        assert ids == sorted(ids)

    def snapper():
        info = s.snapshot(label="t")
        try:
            s.drop(info.id)
        except (CapsuleInUse, UnknownCapsule):
            pass

    def planner():
        s.replan(0, np.ones((2, 3, 14), np.float32))

    threads = [threading.Thread(target=guard(f)) for f in (lister, lister, snapper, planner)]
    for t in threads:
        t.start()
    for o in obs[:300]:
        s.step(o)
    stop.set()
    for t in threads:
        t.join()
    assert not errors, errors[:3]


def test_a_replan_on_a_full_store_keeps_all_its_branch_capsules_and_commits():
    s = Session(small_config(capsule_capacity=12, max_branches=8))
    obs = observation_trace(80)
    for o in obs[:40]:
        s.step(o)
    s.replan(0, np.stack([obs[40:44]] * 8))  # 8 what-ifs fill most of the ring
    res = s.replan(0, np.stack([obs[44:48]] * 8), commit_branch=7)
    assert all(cid in s.store for cid in res.branch_capsule_ids)
    assert s.live_capsule_id == res.branch_capsule_ids[7] and s.step_count == 44


def test_a_failing_on_action_callback_still_leaves_a_consistent_state_and_no_capsule_is_touched():
    s = Session(small_config(kv_window=128))
    obs = observation_trace(300)
    for o in obs[:50]:
        s.step(o)
    pinned = s.pin(s.live_capsule_id).id
    before = s.capsule_host(pinned).tobytes()
    for o in obs[50:255]:  # the next step crosses a page boundary
        s.step(o)

    def publisher_gone(action):
        raise RuntimeError("publisher gone")

    with pytest.raises(RuntimeError, match="publisher gone"):
        s.step(obs[255], on_action=publisher_gone)
    assert s.step_count == 256 and int(s.state_tensors()["meta"][1]) == 256  # the step ran and is counted
    assert s.live_capsule_id and s.capsule_info(s.live_capsule_id).step == 256
    s.step(obs[256])
    assert s.capsule_host(pinned).tobytes() == before
    s.rollback(pinned)
    again = Session(small_config(kv_window=128))
    for o in obs[:50]:
        again.step(o)
    assert s.state_host().tobytes() == again.state_host().tobytes()


def test_a_replan_or_import_that_cannot_fit_is_refused_before_it_evicts_anything(tmp_path):
    """With pins holding what admission allows, an operation needing more fresh log pages than the rest
    could give is refused up front: the rollback history is not thrown away for nothing."""
    from flashrt_ros.runtime.state.kv_log import LogFull

    s = Session(small_config(kv_window=640, capsule_capacity=0, capsule_budget_mb=2.0, max_branches=1))
    obs = observation_trace(4000)
    for o in obs[:700]:
        s.step(o)
    s.export_capsule(0, tmp_path / "c.safetensors")  # a full window: 6 pages to load
    k = 700
    while True:
        for o in obs[k:k + 128]:
            s.step(o)
        k += 128
        try:
            s.snapshot(pin=True)
        except StoreFullOfPins:
            break
    for o in obs[k:k + 800]:
        s.step(o)
    listed = [c.id for c in s.list_capsules()]
    assert_refused_unchanged(s, lambda: s.import_capsule(tmp_path / "c.safetensors"), LogFull, "KV log pages")
    assert_refused_unchanged(s, lambda: s.replan(0, np.ones((1, 8, 14), np.float32), copy_fork=True), LogFull,
                             "KV log pages")
    assert [c.id for c in s.list_capsules()] == listed and s.live_capsule_id in listed
    assert s.replan(0, np.ones((1, 8, 14), np.float32)).steps_done == 8  # a replan that fits still runs


def test_observation_history_of_evicted_what_ifs_is_freed_with_them():
    from test_capsule_oracle import wrapping_config

    s = Session(wrapping_config(records=8000, log_pages=16))  # pages, not records, bound the store
    obs = observation_trace(400)
    for k in range(800):  # a what-if every step: 3 branch capsules with a private page each
        s.step(obs[k % 400])
        s.replan(0, np.stack([obs[:3]] * 3))
    assert len(s.store) < 500 and len(s.history) == len(s.store)
