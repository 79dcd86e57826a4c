"""The demos run end to end and report success (short durations)."""
import json
import subprocess
import sys

import pytest

from conftest import ROOT


def test_runtime_demo_shows_byte_exact_replay_and_the_kv_only_ablation(tmp_path):
    res = subprocess.run([sys.executable, "-m", "flashrt_ros.tools.demo", "--runtime", "--steps", "120",
                          "--json", str(tmp_path / "d.json")], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    s = json.loads((tmp_path / "d.json").read_text())
    assert s["ok"] and s["replay_byte_exact"] and s["replan"]["branch0_equals_live_stepping"]
    assert s["full_restore_max_abs_diff"] == 0.0 and s["kv_only_max_abs_diff"] > 1e-3
    assert "KV-only restore" in res.stdout


# The mission demo (three processes, a clean exit, byte-exact checks) is run once, with its plot:
# test_plots.py::test_mission_plot_draws_the_timeline_of_steps_rollbacks_and_replans.


@pytest.mark.parametrize("steps", [2, 40, 50])
def test_short_runtime_demo_rolls_back_within_its_trace(steps, tmp_path, capsys):
    from flashrt_ros.tools.demo import cli as demo

    demo.main(["--runtime", "--steps", str(steps), "--json", str(tmp_path / "d.json")])
    s = json.loads((tmp_path / "d.json").read_text())
    assert s["rollback_capsule"]["step"] == steps - steps // 2  # half the trace back, a step that was taken
    assert s["replay_byte_exact"] and s["replan"]["branch0_equals_live_stepping"]
    assert s["replan"]["whatif_left_live_untouched"]
    assert s["full_restore_max_abs_diff"] == 0.0 and s["kv_only_max_abs_diff"] > 1e-3


@pytest.mark.parametrize("args, message", [(["--runtime", "--steps", "1"], "--steps must be at least 2"),
                                           (["--runtime", "--steps", "0"], "--steps must be at least 2"),
                                           (["--duration", "0"], "--duration must be > 0")])
def test_demo_refuses_a_run_too_short_to_work_with_one_line(args, message):
    res = subprocess.run([sys.executable, "-m", "flashrt_ros.tools.demo", *args], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 2 and message in res.stderr
    assert "Traceback" not in res.stderr and res.stdout == ""


def test_runtime_demo_compares_a_deadline_cut_replan_over_the_steps_it_did(tmp_path, monkeypatch):
    from flashrt_ros.runtime import Session
    from flashrt_ros.tools.demo import cli as demo

    replan = Session.replan
    monkeypatch.setattr(Session, "replan", lambda self, *a, **kw: replan(self, *a, **{**kw, "deadline_ms": 1e-6}))
    rc = demo.main(["--runtime", "--steps", "40", "--json", str(tmp_path / "d.json")])
    s = json.loads((tmp_path / "d.json").read_text())
    assert s["replan"]["steps_done"] == 1 and not s["replan"]["deadline_met"]  # a loaded machine's partial replan
    assert s["replan"]["branch0_equals_live_stepping"] and s["ok"] and rc == 0
