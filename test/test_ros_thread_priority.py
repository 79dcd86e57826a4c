"""thread_priority: the thread that steps observations runs SCHED_FIFO at that priority, and only it (the
replan worker, the service workers and DDS keep normal scheduling); 0 leaves every thread alone; where the
process may not use SCHED_FIFO the node says so in one warning and steps as usual. replan_nice: the replan
worker (and the threads it splits a replan over) runs at that nice value, every other thread at 0. Checked on
a real node process, reading its threads' scheduling from the kernel."""
import ctypes
import os
import resource
import subprocess
import sys

import numpy as np
import pytest
from ros_harness import NodeProcess, Planner, reference_session

from conftest import observation_trace

pytestmark = pytest.mark.ros
PRIORITY = 7  # low: other real-time work on a loaded test machine keeps going
PR_CAPBSET_DROP, CAP_SYS_NICE = 24, 23  # linux/prctl.h, linux/capability.h


def fifo_allowed() -> str | None:
    """None where this machine lets a process use SCHED_FIFO at PRIORITY; otherwise why not."""
    probe = f"import os; os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param({PRIORITY}))"
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    return None if r.returncode == 0 else r.stderr.strip().splitlines()[-1]


def fifo_threads(pid: int) -> dict[int, int]:
    """tid -> priority of the process's threads that run SCHED_FIFO."""
    out = {}
    for tid in map(int, os.listdir(f"/proc/{pid}/task")):
        try:
            if os.sched_getscheduler(tid) & ~os.SCHED_RESET_ON_FORK == os.SCHED_FIFO:
                out[tid] = os.sched_getparam(tid).sched_priority
        except ProcessLookupError:  # a thread that ended meanwhile
            pass
    return out


def without_realtime() -> None:
    """preexec_fn: the node may not use SCHED_FIFO (no rtprio allowance, no CAP_SYS_NICE even as root)."""
    resource.setrlimit(resource.RLIMIT_RTPRIO, (0, 0))
    if os.geteuid() == 0:  # root: CAP_SYS_NICE would ignore the limit; gone from the bounding set, exec drops it
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_CAPBSET_DROP, CAP_SYS_NICE, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP, CAP_SYS_NICE)")


@pytest.fixture
def start(ros_domain, tmp_path):
    started = []

    def run(preexec_fn=None, **params):
        proc = NodeProcess(ros_domain, tmp_path / "node.log", capsule_dir=str(tmp_path / "capsules"),
                           preexec_fn=preexec_fn, **params)
        planner = Planner()
        started.append((proc, planner))
        planner.wait_ready()
        return proc, planner

    yield run
    for proc, planner in started:
        planner.close()
        rc = proc.stop()
        out = proc.output()
        assert "Traceback" not in out, out[-3000:]
        assert rc == 0, f"node exited with {rc}:\n{out[-3000:]}"


def steps_as_the_reference(planner) -> None:
    """The node steps, action bytes as a Session in the test process, and a service answers (its worker
    thread is started now, by the stepping thread)."""
    obs = observation_trace(8, seed=5)
    ref = reference_session()
    want = np.stack([ref.step(o).action for o in obs])
    assert planner.run(obs).tobytes() == want.tobytes()
    listed = planner.client.list_capsules()
    assert listed.success, listed.message


@pytest.mark.skipif(fifo_allowed() is not None, reason=f"this machine refuses SCHED_FIFO: {fifo_allowed()}")
def test_thread_priority_runs_the_stepping_thread_and_only_it_sched_fifo(start):
    proc, planner = start(thread_priority=PRIORITY)
    steps_as_the_reference(planner)
    pid = proc.proc.pid
    # the main thread spins the executor that steps; the threads it started (service worker) did not inherit it
    assert fifo_threads(pid) == {pid: PRIORITY}
    assert f"runs SCHED_FIFO at priority {PRIORITY}" in proc.output()


def test_thread_priority_zero_leaves_every_thread_normal(start):
    proc, planner = start()  # the default
    steps_as_the_reference(planner)
    assert fifo_threads(proc.proc.pid) == {}
    assert "SCHED_FIFO" not in proc.output()  # no word about it


def test_a_refused_thread_priority_is_one_warning_saying_how_to_allow_it_and_the_node_steps(start):
    proc, planner = start(preexec_fn=without_realtime, thread_priority=PRIORITY)
    steps_as_the_reference(planner)
    assert fifo_threads(proc.proc.pid) == {}
    lines = [line for line in proc.output().splitlines() if "SCHED_FIFO" in line]
    assert len(lines) == 1, lines
    assert "WARN" in lines[0] and "thread_priority 7: this process may not use SCHED_FIFO" in lines[0], lines[0]
    assert "ulimit -r" in lines[0] and "CAP_SYS_NICE" in lines[0], lines[0]


def test_a_thread_priority_past_99_fails_configure_naming_it(ros_domain, tmp_path):
    proc = NodeProcess(ros_domain, tmp_path / "node.log", capsule_dir=str(tmp_path / "capsules"), thread_priority=100)
    try:
        assert proc.proc.wait(60) == 1
    finally:
        proc.stop()
    out = proc.output()
    assert "configure failed: thread_priority: must be in [0, 99], got 100" in out, out[-2000:]
    assert "Traceback" not in out and "SCHED_FIFO" not in out, out[-2000:]


def nice_threads(pid: int, base: int) -> dict[int, int]:
    """tid -> nice value of the process's threads whose nice value is not `base` (the test's own)."""
    out = {}
    for tid in map(int, os.listdir(f"/proc/{pid}/task")):
        try:
            nice = os.getpriority(os.PRIO_PROCESS, tid)
        except ProcessLookupError:
            continue
        if nice != base:
            out[tid] = nice
    return out


@pytest.mark.parametrize("replan_threads", [1, 2])
def test_replan_nice_runs_the_replan_worker_and_only_its_threads_at_that_nice_value(start, replan_threads):
    base = os.getpriority(os.PRIO_PROCESS, 0)  # the node inherits the test's; replan_nice only ever raises it
    nice = min(19, max(11, base + 6))
    assert nice > base, f"the tests run at nice {base}: nothing left to raise"
    proc, planner = start(replan_nice=nice, replan_threads=replan_threads, backend="cpu")
    assert nice_threads(proc.proc.pid, base) == {}  # nothing before the first replan
    for _ in range(2):  # the second replan reuses the split thread, which keeps the value
        out = planner.client.replan(observation_trace(5, seed=3)[None].repeat(4, axis=0))
        assert out.succeeded, (out.reason, out.result.message)
    niced = nice_threads(proc.proc.pid, base)
    assert set(niced.values()) == {nice} and len(niced) == replan_threads, niced  # worker (+ a split thread)
    assert proc.proc.pid not in niced  # the stepping thread
    actions = planner.run(observation_trace(8, seed=5))  # and it steps (the compiled backend: no NumPy bytes)
    assert actions.shape == (8, 7) and np.isfinite(actions).all()
