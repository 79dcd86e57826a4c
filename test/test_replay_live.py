"""flashrt-replay --mode live against a real node process: the same arrays as offline (joint_names
included), bag gaps capped, and SIGTERM / SIGKILL never leave a node behind."""
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from fixtures.make_bags import JOINTS, T0_NS, trace, write_joint_messages
from fixtures.replay_cli import ROOT, TINY_CONFIG, config_with, replay

pytestmark = pytest.mark.ros
DAY_NS = 86_400 * 10**9


@pytest.fixture
def live_env(tmp_path):
    from domain_coordinator import domain_id
    from ros_harness import ros_env

    with domain_id() as did:
        yield ros_env(did, tmp_path / "roslog")


def test_offline_and_live_honour_a_reversed_joint_order_identically(live_env, tmp_path):
    bag = write_joint_messages(tmp_path / "in", trace(200), [T0_NS + i * 10_000_000 for i in range(200)])
    reversed_cfg = config_with(tmp_path, "reversed.yaml", base=TINY_CONFIG, joint_names=list(reversed(JOINTS)))
    default_cfg = config_with(tmp_path, "default.yaml", base=TINY_CONFIG)
    offline, _ = replay(bag, "--config", reversed_cfg, "--out", tmp_path / "offline")
    live, _ = replay(bag, "--mode", "live", "--rate", 0, "--config", reversed_cfg, "--out", tmp_path / "live",
                     env=live_env)
    assert offline["steps"] == live["steps"] == 200
    _, res = replay("diff", tmp_path / "offline", tmp_path / "live")
    assert json.loads(res.stdout)["identical"]
    replay(bag, "--config", default_cfg, "--out", tmp_path / "message_order")
    _, res = replay("diff", tmp_path / "offline", tmp_path / "message_order", expect=1)  # the order matters
    assert json.loads(res.stdout)["differing_steps"] > 0


def test_offline_and_live_see_the_same_arrays_when_the_joint_order_changes_mid_bag(live_env, tmp_path):
    n = 100
    stamps = [T0_NS + i * 10_000_000 for i in range(n)]
    changing = [JOINTS] * 50 + [list(reversed(JOINTS))] * 50  # same values by name, new order from message 51
    bag = write_joint_messages(tmp_path / "changing", trace(n), stamps, names=changing)
    configs = {"unset": config_with(tmp_path, "unset.yaml", base=TINY_CONFIG),
               "configured": config_with(tmp_path, "configured.yaml", base=TINY_CONFIG, joint_names=JOINTS)}
    for label, cfg in configs.items():
        offline, _ = replay(bag, "--config", cfg, "--out", tmp_path / f"offline_{label}")
        live, _ = replay(bag, "--mode", "live", "--rate", 0, "--config", cfg, "--out", tmp_path / f"live_{label}",
                         env=live_env)
        assert offline["steps"] == live["steps"] == n
        _, res = replay("diff", tmp_path / f"offline_{label}", tmp_path / f"live_{label}")
        assert json.loads(res.stdout)["identical"], label
        if label == "unset":  # only joint_names maps by name: the summary says the order changed
            assert offline["joint_order_changes"] == live["joint_order_changes"] == {
                "count": 50, "first_at_message": 51, "first_names": JOINTS}
        else:
            assert "joint_order_changes" not in offline and "joint_order_changes" not in live
    steady = write_joint_messages(tmp_path / "steady", trace(n), stamps)  # never changes order
    replay(steady, "--config", configs["configured"], "--out", tmp_path / "steady_out")
    _, res = replay("diff", tmp_path / "offline_configured", tmp_path / "steady_out")
    assert json.loads(res.stdout)["identical"]  # joint_names: mapped by name, the reorder changes nothing


def test_a_one_day_gap_in_the_bag_replays_in_about_the_capped_time(live_env, tmp_path):
    stamps = [T0_NS + i * 10_000_000 for i in range(20)] + [T0_NS + DAY_NS + i * 10_000_000 for i in range(20)]
    bag = write_joint_messages(tmp_path / "gap", trace(40), stamps)
    summary, _ = replay(bag, "--mode", "live", "--rate", 1, "--max-gap", 0.5, "--config",
                        config_with(tmp_path, base=TINY_CONFIG), env=live_env, timeout=120)
    assert summary["steps"] == 40
    paced_s = 2 * 19 * 0.01 + 0.5  # the bag's timing with the day capped to --max-gap
    assert paced_s - 0.03 <= summary["wall_s"] < paced_s + 8, summary["wall_s"]


def _pid_alive(pid: int) -> bool:
    """A zombie counts as gone: it runs nothing (and PID 1 of a container may never reap it)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _start_live_replay(env, tmp_path):
    """A 30 s live replay; returns (process, node pid) once it streams, and a queue of its stderr lines."""
    bag = write_joint_messages(tmp_path / "long", trace(3000), [T0_NS + i * 10_000_000 for i in range(3000)])
    proc = subprocess.Popen([sys.executable, "-m", "flashrt_ros.tools.replay", str(bag), "--mode", "live",
                             "--config", str(config_with(tmp_path, base=TINY_CONFIG)), "--out", str(tmp_path / "out")],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(x) for x in proc.stderr], daemon=True).start()
    node_pid, deadline = None, time.monotonic() + 90
    while time.monotonic() < deadline:
        try:
            line = lines.get(timeout=1)
        except queue.Empty:
            assert proc.poll() is None, f"replay exited early with {proc.returncode}"
            continue
        if "live: node pid" in line:
            node_pid = int(line.split("node pid ")[1].split(",")[0])
        if "node ready, streaming" in line:
            return proc, node_pid, lines
    proc.kill()
    raise AssertionError("the live replay never started streaming")


def _wait_gone(pid: int, timeout: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not _pid_alive(pid):
            return True
        time.sleep(0.1)
    return False


def _kill_if_alive(pid: int) -> None:
    """Cleanup only: a failing test must not leave a node running."""
    if _pid_alive(pid):
        os.kill(pid, signal.SIGKILL)


def test_sigterm_ends_the_live_replay_and_its_node(live_env, tmp_path):
    proc, node_pid, lines = _start_live_replay(live_env, tmp_path)
    try:
        assert _pid_alive(node_pid)
        time.sleep(0.5)
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=30)
        stderr = "".join(iter(lambda: lines.get(timeout=2) if not lines.empty() else None, None))
        assert rc == 128 + signal.SIGTERM, stderr
        assert "interrupted by SIGTERM" in stderr and "Traceback" not in stderr
        assert _wait_gone(node_pid), f"node {node_pid} still running after the replay ended"
        assert not (tmp_path / "out").exists()  # an interrupted run leaves no bag that looks like a result
    finally:
        proc.kill()
        _kill_if_alive(node_pid)


def test_sigkill_of_the_live_replay_takes_its_node_down_too(live_env, tmp_path):
    proc, node_pid, _ = _start_live_replay(live_env, tmp_path)
    try:
        proc.kill()
        proc.wait(timeout=10)
        assert _wait_gone(node_pid), f"node {node_pid} outlived its parent"
    finally:
        _kill_if_alive(node_pid)
