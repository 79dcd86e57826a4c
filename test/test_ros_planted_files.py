"""Issue 44.4: files planted from outside never hang the node, and SIGTERM always ends it within 5 s.

A FIFO planted in /dev/shm at a Fast DDS port's lock name hung the node's start-up for good (Fast DDS waits on
it inside rclpy, where no Python signal handler runs), and the hung node ignored SIGTERM. The tests with a
FIFO in /dev/shm plant it in a private /dev/shm (a mount namespace: root only), never in the shared one."""
import os
import signal
import subprocess
import sys
import time

import pytest
from ros_harness import ROOT, fresh_domain, ros_env

from flashrt_ros.ros.platform.dead_participants import shm_port

pytestmark = [pytest.mark.ros, pytest.mark.graph]  # env: a domain of its own
SIGNAL_LIMIT_S = 5.0


@pytest.fixture
def env(tmp_path):
    with fresh_domain() as did:
        yield ros_env(did, tmp_path / "roslog"), did


def _wait_for(proc, log_path, text: str, timeout: float) -> None:
    end = time.monotonic() + timeout
    while text not in log_path.read_text():
        assert proc.poll() is None, log_path.read_text()[-3000:]
        assert time.monotonic() < end, f"no {text!r} in {timeout} s: {log_path.read_text()[-3000:]}"
        time.sleep(0.05)


def _seconds_to_end_on_sigterm(proc) -> float:
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(15.0)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        return float("inf")
    return time.monotonic() - t0


def test_sigterm_ends_a_node_stuck_in_a_system_call_within_5_s(env, tmp_path):
    """Past the start (the node exists), a call that never returns (here: opening a FIFO no one writes, as the
    /dev/shm scan once did) and retries after each signal: SIGTERM still ends the process, exit 1 with every
    thread's stack."""
    environ, _ = env
    fifo = tmp_path / "planted"
    os.mkfifo(fifo)
    code = ("import os, sys\n"
            "import flashrt_ros.ros.main as n\n"
            "def stuck():\n"
            "    print('stuck now', file=sys.stderr, flush=True)\n"
            f"    os.open({str(fifo)!r}, os.O_RDONLY)\n"
            "n.keep_freed_memory = stuck\n"
            "sys.exit(n.main(sys.argv))\n")
    log_path = tmp_path / "node.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen([sys.executable, "-c", code, "--ros-args", "-p", "backend:=numpy"], cwd=ROOT,
                                env=environ, stdout=log, stderr=subprocess.STDOUT)
        try:
            _wait_for(proc, log_path, "stuck now", 60.0)
            took = _seconds_to_end_on_sigterm(proc)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    out = log_path.read_text()
    assert took < SIGNAL_LIMIT_S, (took, out[-3000:])
    assert proc.returncode == 1 and "in stuck" in out and "Timeout (0:00:04)!" in out, out[-3000:]


def _private_shm_available() -> bool:
    if os.geteuid() != 0:
        return False
    return subprocess.run(["unshare", "-m", "true"], capture_output=True).returncode == 0


needs_private_shm = pytest.mark.skipif(not _private_shm_available(),
                                       reason="a private /dev/shm needs root and unshare -m")


def _node_in_private_shm(environ, did: int, log_path, code: str):
    """The node in a mount namespace whose /dev/shm is a fresh tmpfs holding a FIFO at the lock file name of
    participant 0's shared-memory port in domain ``did`` (the first port Fast DDS takes)."""
    lock = f"/dev/shm/fastdds_port{shm_port(did, 0)}_el"
    script = f'mount -t tmpfs tmpfs /dev/shm && mkfifo {lock} && exec "$0" -c "$1" --ros-args -p backend:=numpy'
    log = open(log_path, "w")
    proc = subprocess.Popen(["unshare", "-m", "sh", "-c", script, sys.executable, code], cwd=ROOT, env=environ,
                            stdout=log, stderr=subprocess.STDOUT)
    return proc, log, lock


@needs_private_shm
def test_a_fifo_at_a_fast_dds_port_lock_name_refuses_the_start_naming_it(env, tmp_path):
    environ, did = env
    log_path = tmp_path / "node.log"
    code = "import sys, flashrt_ros.ros.main as n; sys.exit(n.main(sys.argv))"
    proc, log, lock = _node_in_private_shm(environ, did, log_path, code)
    try:
        rc = proc.wait(60.0)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()
    out = log_path.read_text()
    assert rc == 2, (rc, out[-3000:])
    assert (f"flashrt: cannot start: {lock} named as Fast DDS shared-memory port files of domain {did} but not "
            "regular files (planted?)") in out, out[-3000:]


@needs_private_shm
def test_sigterm_ends_a_start_that_fast_dds_hangs_within_5_s(env, tmp_path):
    """With the refusal above taken out, Fast DDS waits on the FIFO inside rclpy's node creation, where no
    Python signal handler runs: until the node exists SIGTERM keeps its default action and ends the process."""
    environ, did = env
    log_path = tmp_path / "node.log"
    code = ("import sys, flashrt_ros.ros.main as n\n"
            "n.planted_port_files = lambda *a: []\n"
            "print('starting', file=sys.stderr, flush=True)\n"
            "sys.exit(n.main(sys.argv))\n")
    proc, log, _ = _node_in_private_shm(environ, did, log_path, code)
    try:
        _wait_for(proc, log_path, "starting", 60.0)
        time.sleep(3.0)  # into rclpy: the node never logs its first line
        if "DDS profile" in log_path.read_text():  # Jazzy's Fast DDS (2.14) opens the FIFO without blocking
            pytest.skip("this Fast DDS does not block on a FIFO at its port file: no hung start to end")
        assert proc.poll() is None, log_path.read_text()[-3000:]
        took = _seconds_to_end_on_sigterm(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()
    assert took < SIGNAL_LIMIT_S, (took, log_path.read_text()[-3000:])
    assert proc.returncode == -signal.SIGTERM
