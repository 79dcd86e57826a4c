"""flashrt-replay's exit codes: each outcome its own code, documented in --help; a crash never exits with
a code that means a result; the default config is found from a colcon install."""
import json
import os
import shutil
import signal
import subprocess
import sys

import pytest
from fixtures.make_bags import T0_NS, trace, write_joint_messages
from fixtures.replay_cli import ROOT, TINY_CONFIG, config_with, replay


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("codes")
    bag = write_joint_messages(tmp / "in", trace(30), [T0_NS + i * 10_000_000 for i in range(30)])
    return bag, config_with(tmp, base=TINY_CONFIG)


def test_help_documents_every_exit_code_and_max_gap():
    res = subprocess.run([sys.executable, "-m", "flashrt_ros.tools.replay", "--help"], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0
    for line in ("0    ok", "1    rollback checks failed", "2    bad input", "3    no step", "4    internal error",
                 "5    live mode", "130  interrupted", "141  stdout or stderr was closed", "--max-gap"):
        assert line in res.stdout, line


def test_a_bag_whose_every_message_is_rejected_fails_with_the_no_step_code(small, tmp_path):
    bag, _ = small
    wrong_dim = config_with(tmp_path, base=TINY_CONFIG.replace("obs_dim: 14", "obs_dim: 12"))
    summary, res = replay(bag, "--config", wrong_dim, "--out", tmp_path / "out", expect=3)
    assert summary["steps"] == 0 and summary["messages"] == 30
    assert summary["rejected"]["reasons"] == {
        "JointState gives 7 positions + 7 velocities = 14 values, obs_dim is 12": 30}
    assert "no step: all 30 messages were rejected" in res.stderr
    assert not (tmp_path / "out").exists()  # an empty output bag would look like a result


def test_an_unexpected_exception_is_one_line_and_the_internal_error_code(small):
    bag, cfg = small
    code = ("import sys; from flashrt_ros.tools.replay import cli as replay\n"
            "def boom(*a, **k): raise ZeroDivisionError('planted')\n"
            "replay.run_offline = boom\n"
            f"sys.exit(replay.main([{str(bag)!r}, '--config', {str(cfg)!r}]))")
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert res.returncode == 4, res.stderr
    assert res.stderr.strip().splitlines()[-1].startswith("flashrt-replay: internal error: ZeroDivisionError: planted")
    assert "Traceback" not in res.stderr and res.stdout == ""


def test_an_unreadable_config_is_bad_input(small, tmp_path):
    bag, _ = small
    (tmp_path / "broken.yaml").write_text("/**:\n  ros__parameters:\n    d_model: [1, 2\n")
    _, res = replay(bag, "--config", tmp_path / "broken.yaml", expect=2)
    assert "--config" in res.stderr and res.stderr.count("\n") == 1


def test_a_rollback_depth_past_what_the_config_keeps_is_bad_input_before_any_step(small, tmp_path):
    bag, cfg = small  # capsule_capacity 4, max_branches 1: two steps restorable
    summary, res = replay(bag, "--config", cfg, "--rollback-every", 10, "--rollback-depth", 3,
                          "--out", tmp_path / "out", expect=2)
    assert "--rollback-depth 3" in res.stderr and "keeps 2 steps" in res.stderr and res.stderr.count("\n") == 1
    assert not (tmp_path / "out").exists()
    replay(bag, "--config", cfg, "--rollback-every", 10, "--rollback-depth", 2, expect=0)


def _colcon_like_install(tmp_path, with_share_config: bool):
    """The package as a colcon install lays it out: Python modules in one place (no config/ beside them),
    config and interface definitions in the ament share, found through AMENT_PREFIX_PATH."""
    site, prefix = tmp_path / "site", tmp_path / "prefix"
    shutil.copytree(ROOT / "flashrt_ros", site / "flashrt_ros", ignore=shutil.ignore_patterns("__pycache__"))
    index = prefix / "share" / "ament_index" / "resource_index" / "packages"
    index.mkdir(parents=True)
    for pkg in ("flashrt_ros", "flashrt_interfaces"):
        (index / pkg).write_text("")
    shutil.copytree(ROOT / "flashrt_interfaces" / "msg", prefix / "share" / "flashrt_interfaces" / "msg")
    share_cfg = prefix / "share" / "flashrt_ros" / "config" / "flashrt.yaml"
    share_cfg.parent.mkdir(parents=True)
    if with_share_config:
        share_cfg.write_text(TINY_CONFIG)
    env = dict(os.environ, PYTHONPATH=str(site), AMENT_PREFIX_PATH=str(prefix))
    return env, share_cfg


@pytest.mark.ros  # a colcon layout: needs ament_index_python (absent from test-compat's venv)
def test_from_a_colcon_install_the_default_config_comes_from_the_ament_share(small, tmp_path):
    bag, _ = small
    env, share_cfg = _colcon_like_install(tmp_path, with_share_config=True)
    summary, _ = replay(bag, env=env, cwd=tmp_path)
    assert summary["config"] == str(share_cfg) and summary["steps"] == 30


@pytest.mark.ros
def test_without_any_default_config_the_error_says_to_pass_one(small, tmp_path):
    bag, _ = small
    env, _ = _colcon_like_install(tmp_path, with_share_config=False)
    _, res = replay(bag, env=env, cwd=tmp_path, expect=2)
    assert "no default config" in res.stderr and "pass --config" in res.stderr


def _replay_into(write_fd: int, *args, stderr=subprocess.PIPE) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "flashrt_ros.tools.replay", *map(str, args)], cwd=ROOT,
                            stdout=write_fd, stderr=stderr, text=True)


@pytest.mark.parametrize("command", ["replay", "diff"])
def test_a_stdout_closed_by_its_reader_ends_quietly_with_the_sigpipe_code(small, tmp_path, command):
    bag, cfg = small
    if command == "diff":
        replay(bag, "--config", cfg, "--out", tmp_path / "run")
        args = ("diff", tmp_path / "run", tmp_path / "run")
    else:
        args = (bag, "--config", cfg, "--json", tmp_path / "s.json")
    read_fd, write_fd = os.pipe()
    os.close(read_fd)  # the reader is gone before anything is written: every write to stdout fails
    proc = _replay_into(write_fd, *args)
    os.close(write_fd)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 141, stderr
    assert "internal error" not in stderr and "Traceback" not in stderr and "Exception ignored" not in stderr
    if command == "replay":  # the summary file does not depend on stdout
        assert json.loads((tmp_path / "s.json").read_text())["steps"] == 30


def test_head_dash_1_on_stdout_and_stderr_together_ends_quietly_with_the_sigpipe_code(small, tmp_path):
    """`flashrt-replay BAG --out OUT 2>&1 | head -1`: the reader takes the first line and leaves."""
    bag, cfg = small
    read_fd, write_fd = os.pipe()
    proc = _replay_into(write_fd, bag, "--config", cfg, "--out", tmp_path / "out", stderr=write_fd)
    os.close(write_fd)
    with os.fdopen(read_fd, "rb") as reader:
        first = reader.readline()
    assert first.strip(), "the run printed nothing"
    assert proc.wait(timeout=120) == 141


EVERY_MESSAGE = ("import sys; from flashrt_ros.tools.replay import cli as replay; replay.PROGRESS_EVERY = 1; "
                 "sys.exit(replay.main(sys.argv[1:]))")


@pytest.mark.parametrize("after", ["offline: sensor_msgs", "offline: 1 messages", "offline: 300 messages"])
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_during_an_offline_replay_exits_with_its_code_and_leaves_no_output(tmp_path, after, signum):
    bag = write_joint_messages(tmp_path / "in", trace(3000), [T0_NS + i * 10_000_000 for i in range(3000)])
    proc = subprocess.Popen([sys.executable, "-c", EVERY_MESSAGE, str(bag), "--config",
                             str(config_with(tmp_path, base=TINY_CONFIG)), "--out", str(tmp_path / "out")],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seen = []
    for line in proc.stderr:
        seen.append(line)
        if after in line:
            proc.send_signal(signum)
            break
    seen.append(proc.stderr.read())
    rc = proc.wait(timeout=120)
    stderr = "".join(seen)
    assert rc == 128 + signum, stderr
    assert f"interrupted by {signal.Signals(signum).name}" in stderr
    assert "internal error" not in stderr and "Traceback" not in stderr, stderr
    assert not (tmp_path / "out").exists()
