"""`flashrt-bench persist --quick` end to end: every key is there and every value is consistent.

Speed is the benchmark's business; asserted here is what holds on any machine: the arithmetic of the
reported rates and ratios, a resumed state equal to its writer's, and a kill loop whose every child
continued the log the previous one left.
"""
import json
import subprocess
import sys

import pytest

from conftest import ROOT
from flashrt_ros.runtime.persist.writer import MB, PersistSettings


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench") / "persist.json"
    res = subprocess.run([sys.executable, "-m", "flashrt_ros.tools.bench", "persist", "--quick", "--json", str(out)],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    return json.loads(out.read_text()), res


def defaults() -> dict:
    st = PersistSettings("unused")
    return {k: getattr(st, k) for k in ("fsync_every_records", "fsync_every_ms", "segment_mb", "budget_mb", "queue_mb")}


def test_quick_persist_bench_prints_the_json_on_stdout_and_progress_on_stderr(quick):
    data, res = quick
    assert json.loads(res.stdout) == data
    assert "kill 2/2" in res.stderr and "{" not in res.stderr
    assert data["quick"] is True and data["backend"] == "numpy"
    for key in ("persist_step_overhead", "persist_mb_per_s", "resume_ms", "records_lost_on_kill"):
        assert data[key]["what"]


def test_step_overhead_compares_both_arms_side_by_side_with_the_default_durability(quick):
    o = quick[0]["persist_step_overhead"]
    assert o["persist_settings"] == defaults() and o["rate_hz"] == 100.0
    assert o["steps_per_arm"] == 3 * 25 and o["records_written"] == 30 + 3 * 25 and o["records_dropped"] == 0
    w, wo = o["with_persistence_ms"], o["without_persistence_ms"]
    assert 0 < w["p50"] <= w["p99"] and 0 < wo["p50"] <= wo["p99"]
    assert o["p99_ratio"] == round(w["p99"] / wo["p99"], 3) and o["p50_ratio"] == round(w["p50"] / wo["p50"], 3)


def test_write_rate_is_the_log_bytes_over_the_steps_at_100_hz(quick):
    m, r = quick[0]["persist_mb_per_s"], quick[0]["resume_ms"]
    assert m["steps"] == r["log_steps"] == 1500 and m["log_bytes"] == r["log_written"]["log_bytes"]
    assert m["mib_per_s"] == round(m["log_bytes"] / MB / 15.0, 3)
    assert m["bytes_per_step"] == round(m["log_bytes"] / 1500)


def test_resume_restores_the_writers_state_from_the_whole_log(quick):
    r = quick[0]["resume_ms"]
    assert r["state_matches_writer"] is True
    assert r["resumed_step"] == 1500 and r["records_cut"] == 0
    assert r["log_written"]["records_dropped"] == 0 and r["records_read"] == 1500  # the store holds them all
    assert r["capsules_restored"] == 1500 <= r["store_capacity"]
    assert 0 < r["rebuild_ms"] <= r["ms"]


def test_kill_loop_counts_lost_records_and_each_child_continues_the_log(quick):
    k = quick[0]["records_lost_on_kill"]
    rounds = k["rounds"]
    assert k["kills"] == len(rounds) == 2 and k["persist_settings"] == defaults()
    assert rounds[0]["started_at_step"] == 0
    for before, after in zip(rounds, rounds[1:]):
        assert after["started_at_step"] == before["resumed_step"]  # the next child resumed this log
    for r in rounds:
        assert r["lost"] == max(0, r["last_reported"] - r["resumed_step"])
        assert r["resumed_step"] >= r["started_at_step"]
    assert k["max"] == max(r["lost"] for r in rounds)
    assert k["mean"] == round(sum(r["lost"] for r in rounds) / 2, 3)
