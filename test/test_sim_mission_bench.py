"""flashrt-bench task: one JSON with every task figure of issue 46, said to be offline, with its machine."""
import json

import pytest

from flashrt_ros.tools.bench.cli import main

KEYS = ("expert_success", "policy_success", "no_fault_success", "uncorrected_success", "corrected_success",
        "whatif_selection_success", "replan_p99_ms", "deadline_misses", "byte_exact_checks", "episodes", "seeds")


def test_the_bench_task_prints_every_key_of_the_issue_offline(tmp_path, capsys):
    out = tmp_path / "task.json"
    assert main(["task", "--episodes", "1", "--seconds", "1.5", "--backend", "numpy", "--json", str(out)]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed == json.loads(out.read_text())
    assert set(KEYS) <= set(printed)
    assert printed["mode"] == "offline"
    assert printed["episodes"] == 1 and printed["seeds"]["first"] == 2 ** 32
    assert set(printed["whatif_selection_success"]) == {"with", "without"}
    for key in ("expert_success", "policy_success", "no_fault_success", "uncorrected_success", "corrected_success"):
        assert 0.0 <= printed[key] <= 1.0
    checks = printed["byte_exact_checks"]
    assert checks["total"] >= 1 and checks["passed"] == checks["total"]
    assert printed["replans"] == printed["faults"]["total"] >= 1
    assert printed["replan_p99_ms"] > 0 and printed["deadline_misses"] >= 0
    assert printed["whatif"]["tried"] >= 1
    assert printed["machine"]["backend"] == "numpy" and "load_avg_before" in printed["machine"]


def test_the_bench_task_refuses_no_episodes(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["task", "--episodes", "0"])
    assert exit_.value.code == 2
    assert "--episodes" in capsys.readouterr().err
