"""The installed flashrt-replay script, run as a user runs it (its own process): the summary and exit code that
main(argv) gives in the test process, where the other replay tests call it."""
import json
import os
import subprocess
import sys

import pytest
from fixtures.make_bags import T0_NS, trace, write_joint_messages
from fixtures.replay_cli import ROOT, TINY_CONFIG, config_with, replay_in_process

SCRIPT = os.path.join(os.path.dirname(sys.executable), "flashrt-replay")
RUN_DEPENDENT = ("wall_s", "steps_per_s", "step_latency_ms")  # timings of the run, not its result


def result_of(summary: dict) -> dict:
    return {k: v for k, v in summary.items() if k not in RUN_DEPENDENT}


@pytest.mark.skipif(not os.access(SCRIPT, os.X_OK), reason=f"no console script beside {sys.executable}")
def test_the_console_script_gives_the_summary_and_exit_code_of_main_in_process(tmp_path):
    bag = write_joint_messages(tmp_path / "in", trace(30), [T0_NS + i * 10_000_000 for i in range(30)])
    cfg = config_with(tmp_path, base=TINY_CONFIG)
    args = [str(bag), "--config", str(cfg), "--rollback-every", "10", "--rollback-depth", "2"]
    script = subprocess.run([SCRIPT, *args], cwd=ROOT, capture_output=True, text=True, timeout=300)
    in_process = replay_in_process(*args)
    assert script.returncode == in_process.returncode == 0, script.stderr[-3000:]
    assert "Traceback" not in script.stderr
    want = json.loads(in_process.stdout)
    assert want["steps"] == 30 and want["rollback_checks"]["run"] >= 2
    assert result_of(json.loads(script.stdout)) == result_of(want)
