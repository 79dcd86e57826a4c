"""flashrt-replay --mode live against a real node process: the same arrays as offline (joint_names
included), bag gaps capped, and SIGTERM / SIGKILL never leave a node behind."""
import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from fixtures.make_bags import JOINTS, T0_NS, trace, write_joint_messages
from fixtures.replay_cli import ROOT, TINY_CONFIG, config_with, replay

pytestmark = [pytest.mark.ros, pytest.mark.graph]  # live_env: a domain of its own
DAY_NS = 86_400 * 10**9


@pytest.fixture
def live_env(tmp_path):
    from ros_harness import fresh_domain, ros_env

    with fresh_domain() as did:
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
    # the live --out holds the node's own capsule stream: every step's record, and the same states as offline's
    from flashrt_ros.tools.replay.bags import iter_capsule_records, typestore
    ts = typestore()
    live_records = [m for _, m in iter_capsule_records(tmp_path / "live", ts)]
    offline_records = [m for _, m in iter_capsule_records(tmp_path / "offline", ts)]
    assert [int(m.step) for m in live_records] == list(range(1, 201)) and live_records[0].kind == 2  # a keyframe
    assert [bytes(m.record) for m in live_records] == [bytes(m.record) for m in offline_records]
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


@pytest.mark.serial  # its wall time is asserted
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


# flashrt-replay with a progress line after every message, so a test can act at a known step
EVERY_MESSAGE = ("import sys; from flashrt_ros.tools.replay import cli as replay, live as replay_live; "
                 "replay_live.PROGRESS_EVERY = 1; "
                 "sys.exit(replay.main(sys.argv[1:]))")
STEPS_LINE = re.compile(r"live: \d+ messages, (\d+) steps")


class LiveReplay:
    """A 30 s live replay in its own process; its stderr lines are collected as they come."""

    def __init__(self, env, tmp_path, *extra):
        bag = write_joint_messages(tmp_path / "long", trace(3000), [T0_NS + i * 10_000_000 for i in range(3000)])
        self.proc = subprocess.Popen([sys.executable, "-c", EVERY_MESSAGE, str(bag), "--mode", "live", "--config",
                                      str(config_with(tmp_path, base=TINY_CONFIG)), "--out", str(tmp_path / "out"),
                                      *map(str, extra)],
                                     cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.lines: queue.Queue = queue.Queue()
        self.seen: list[str] = []
        self._reader = threading.Thread(target=lambda: [self.lines.put(x) for x in self.proc.stderr], daemon=True)
        self._reader.start()
        self.node_pid = None

    def wait_for(self, done, timeout: float = 90.0) -> None:
        """Until done(line) is true for a stderr line (the node's pid is picked up on the way)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=1)
            except queue.Empty:
                assert self.proc.poll() is None, f"replay exited early with {self.proc.returncode}: {self.stderr()}"
                continue
            self.seen.append(line)
            if "live: node pid" in line:
                self.node_pid = int(line.split("node pid ")[1].split(",")[0])
            if done(line):
                return
        raise AssertionError(f"the live replay never printed the line waited for: {self.stderr()}")

    def stderr(self) -> str:
        """Everything it printed so far; all of it once the process has exited."""
        if self.proc.poll() is not None:
            self._reader.join(timeout=10)
        while not self.lines.empty():
            self.seen.append(self.lines.get())
        return "".join(self.seen)

    def cleanup(self) -> None:
        self.proc.kill()
        self.proc.wait()
        if self.node_pid is not None:
            _kill_if_alive(self.node_pid)


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


def _line_with(text: str):
    return lambda line: text in line


def _after_step(n: int):
    return lambda line: (m := STEPS_LINE.search(line)) is not None and int(m.group(1)) >= n


TERM, INT = signal.SIGTERM, signal.SIGINT


@pytest.mark.parametrize("signals, when, extra", [
    ((TERM,), _line_with("live: node pid"), ()),  # the node starting, rclpy being set up and waiting for it
    ((TERM,), _line_with("node ready, streaming"), ()),
    ((TERM,), _after_step(1), ()),
    ((TERM,), _after_step(7), ()),
    ((TERM,), _after_step(40), ()),
    ((TERM,), _after_step(150), ()),
    ((TERM,), _after_step(30), ("--rate", 1)),  # paced: mostly waiting for the bag's next stamp
    ((TERM,), _after_step(23), ("--rollback-every", 5, "--rollback-depth", 2)),  # rollbacks and re-feeds
    ((INT,), _after_step(12), ()),
    ((TERM, TERM, INT), _after_step(20), ()),  # more signals while it stops the node
], ids=["starting", "ready", "step1", "step7", "step40", "step150", "paced_step30", "rollbacks_step23",
        "sigint_step12", "three_signals_step20"])
def test_a_signal_at_any_point_ends_the_live_replay_and_its_node_cleanly(live_env, tmp_path, signals, when, extra):
    """--rate 0 keeps the replay inside rclpy almost all the time: a signal handler that raised there
    came out as 'internal error: RuntimeError: Unable to convert call argument' and exit 4."""
    run = LiveReplay(live_env, tmp_path, *(extra or ("--rate", 0)))
    try:
        run.wait_for(when)
        assert run.node_pid is not None and _pid_alive(run.node_pid)
        for signum in signals:
            run.proc.send_signal(signum)
        rc = run.proc.wait(timeout=60)
        stderr = run.stderr()
        assert rc - 128 in signals, stderr  # signals pending together are handled lowest number first
        assert f"interrupted by {signal.Signals(rc - 128).name}" in stderr, stderr
        assert "internal error" not in stderr and "Traceback" not in stderr, stderr
        assert _wait_gone(run.node_pid), f"node {run.node_pid} still running after the replay ended"
        assert not (tmp_path / "out").exists()  # an interrupted run leaves no bag that looks like a result
    finally:
        run.cleanup()


def test_sigkill_of_the_live_replay_takes_its_node_down_too(live_env, tmp_path):
    run = LiveReplay(live_env, tmp_path)
    try:
        run.wait_for(_line_with("node ready, streaming"))
        run.proc.kill()
        run.proc.wait(timeout=10)
        assert _wait_gone(run.node_pid), f"node {run.node_pid} outlived its parent"
    finally:
        run.cleanup()
