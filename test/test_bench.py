"""`flashrt-bench runtime --quick` end to end (toy sizes): every key is there and every value is sane.

Numbers are not judged against targets here (that is the benchmark's job); what is asserted is what
holds on any machine: exact byte counts, the sizing rule's depth, a store that keeps at least the
depth it promises, a full window where one is claimed, an ablation that diverges and a restore that
does not.
"""
import json
import subprocess
import sys

import pytest

from conftest import ROOT
from flashrt_ros.runtime import PolicyConfig
from flashrt_ros.runtime.engine.backend import cuda_probe
from flashrt_ros.runtime.state.sizing import StoreSizes
from flashrt_ros.tools.bench import gpu as bench_gpu


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench") / "runtime.json"
    res = subprocess.run([sys.executable, "-m", "flashrt_ros.tools.bench", "runtime", "--quick", "--json", str(out)],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    return json.loads(out.read_text()), res


def is_pct(d):
    return d["p50"] > 0 and d["p99"] >= d["p50"]


def test_quick_runtime_bench_prints_the_json_on_stdout_and_progress_on_stderr(quick):
    data, res = quick
    assert json.loads(res.stdout) == data
    assert "rollback depth check" in res.stderr and "{" not in res.stderr
    assert data["quick"] is True and data["backend"] == ("cuda" if cuda_probe() is None else "cpu")  # auto


def test_capsule_bytes_per_step_is_the_record_plus_one_kv_entry_and_matches_store_growth(quick):
    b = quick[0]["capsule_bytes_per_step"]
    cfg = PolicyConfig()
    entry = cfg.n_layers * 2 * cfg.d_model * 4
    assert b["kv_entry_bytes"] == entry and b["predicted"] == b["record_bytes"] + entry
    assert b["measured"] == b["predicted"] and not b["eviction_during_measure"]
    assert b["full_row_capsule_bytes"] == b["record_bytes"] + cfg.n_layers * 2 * b["kv_window"] * cfg.d_model * 4


def test_rollback_depth_reports_the_sizing_rule_at_the_default_budget_and_a_measured_depth(quick):
    depth = quick[0]["rollback_depth_s"]
    assert depth["budget_mb"] == PolicyConfig().capsule_budget_mb and depth["rate_hz"] == 100.0
    for w in (1024, 16384):
        steps = StoreSizes.plan(PolicyConfig(kv_window=w)).rollback_depth_steps
        assert depth[f"kv_window_{w}"] == round(steps / 100, 2)
        assert depth[f"kv_window_{w}_detail"]["rollback_depth_steps"] == steps
    for key, bound in (("verified", "records"), ("verified_log_bound", "log")):
        v = depth[key]
        assert v["bound"] == bound and v["eviction_started_at_step"] is not None
        assert v["steps_run"] > v["eviction_started_at_step"] + v["kv_window"]
        assert v["predicted_steps"] > 0 and v["measured_min_steps"] >= v["predicted_steps"]  # the promise is kept
        assert v["measured_max_steps"] >= v["measured_min_steps"] and v["oldest_restored_step"] > 0
    assert depth["verified"]["eviction_started_at_step"] == depth["verified"]["records"] + 1  # records ran out
    assert depth["verified_log_bound"]["eviction_started_at_step"] < depth["verified_log_bound"]["records"]


def test_step_capsule_overhead_is_measured_a_b_at_a_full_window(quick):
    over = quick[0]["step_capsule_overhead"]
    assert set(over) == {"kv_window_128"}
    o = over["kv_window_128"]
    assert o["kv_len"] == o["kv_window"] == 128 and o["pairs"] == 16
    assert is_pct(o["with_capsule_ms"]) and is_pct(o["without_capsule_ms"])
    assert o["overhead"] == round((o["with_capsule_ms"]["p50"] - o["without_capsule_ms"]["p50"])
                                  / o["without_capsule_ms"]["p50"], 4)


def test_replan_shared_and_copy_fork_are_reported_for_the_same_cases_with_the_window_full(quick):
    d = quick[0]
    cases = {"4x8@128", "8x8@128", "4x8@256"}
    assert set(d["replan_ms"]) == set(d["copy_fork_replan_ms"]) == set(d["copy_fork_over_shared"]) == cases
    for case in cases:
        assert is_pct(d["replan_ms"][case]) and is_pct(d["copy_fork_replan_ms"][case])
        assert d["copy_fork_over_shared"][case] == pytest.approx(
            d["copy_fork_replan_ms"][case]["p50"] / d["replan_ms"][case]["p50"], abs=1e-3)
        det = d["replan_detail"][case]
        assert det["kv_len"] == det["kv_window"] and det["step"] > det["kv_window"]
        assert det["kv_fill"] == f"{det['kv_window']}/{det['kv_window']}"  # what the README quotes
    assert d["copy_fork_over_shared_vs"].startswith("shared-window replan")


def test_each_replan_is_also_measured_after_an_idle_gap_beside_the_back_to_back_one(quick):
    d = quick[0]
    assert set(d["replan_after_idle_ms"]) == set(d["replan_ms"])
    assert d["replan_after_idle_vs"].startswith("the same replan back to back")
    for case, idle in d["replan_after_idle_ms"].items():
        assert idle["idle_ms"] == 5.0 and is_pct(idle)
        assert idle["over_back_to_back_p50"] == pytest.approx(idle["p50"] / d["replan_ms"][case]["p50"], abs=1e-3)


def test_the_compiled_backend_also_reports_each_replan_split_over_two_threads_in_the_same_run(quick):
    d = quick[0]
    if d["backend"] != "cpu":
        assert "replan_split_ms" not in d  # only the compiled CPU step splits rows over threads
        return
    assert set(d["replan_split_ms"]) == set(d["replan_ms"])
    for case, split in d["replan_split_ms"].items():
        assert split["threads"] == 2 and is_pct(split)
        assert split["speedup_p50"] == pytest.approx(d["replan_ms"][case]["p50"] / split["p50"], abs=1e-3)


def test_history_points_keep_the_old_keys_with_capsule_bytes_independent_of_the_window(quick):
    hs = quick[0]["histories"]
    assert [h["history"] for h in hs] == [128, 256]
    for h in hs:
        for key in ("snapshot_ms", "restore_ms", "memcpy_ms", "cold_prefill_ms", "rollback_replan_ms"):
            assert h[key] > 0, key
        assert h["memcpy_bytes"] == h["capsule_bytes"] < h["full_row_capsule_bytes"]
        assert h["speedup_vs"] == "tuned cold prefill on the same backend"
        assert h["speedup_vs_prefill"] == round(h["cold_prefill_ms"] / h["rollback_replan_ms"], 2)
        assert h["cold_replay_ms"] is None or h["cold_replay_ms"] > 0
    assert hs[0]["capsule_bytes"] == hs[1]["capsule_bytes"]  # 2 and 3 page-table slots fit one aligned block
    for h in hs:  # issue 47: each restore's share of a default step, against its target
        share = quick[0]["acceptance"][f"restore_over_step.history_{h['history']}"]
        assert share["value"] == round(h["restore_ms"] / quick[0]["step_latency_ms"]["p50"], 4)
        assert share["met"] == (share["value"] <= 0.05) and share["target"] == "<= 0.05"
    assert hs[1]["full_row_capsule_bytes"] - hs[1]["capsule_bytes"] == 2 * (
        hs[0]["full_row_capsule_bytes"] - hs[0]["capsule_bytes"])


def test_the_kv_only_ablation_diverges_and_the_full_restore_is_exact(quick):
    d = quick[0]
    assert d["kv_only_max_abs_diff"] > 1e-3 and d["full_restore_max_abs_diff"] == 0.0
    assert is_pct(d["step_latency_ms"])
    assert d["acceptance"]["full_restore_max_abs_diff"]["met"] is True
    assert set(d["acceptance"]) >= {"capsule_bytes_per_step", "rollback_depth_s.kv_window_1024",
                                    "rollback_depth_s.kv_window_16384", "replan_ms.4x8@128.p50"}


def test_gpu_bench_measurements_run_on_the_cpu_backend_at_toy_sizes():
    p = bench_gpu.point(PolicyConfig(kv_window=128, capsule_budget_mb=64), "numpy", bench_gpu.GpuPlan.tiny())
    assert p["kv_len"] == 128 and p["capsule_bytes_per_step"]["measured"] == p["capsule_bytes_per_step"]["predicted"]
    c = p["copies"]
    assert c["snapshot_copy_ms"] > 0 and c["raw_copy_ms"] > 0 and is_pct(c["snapshot_ms"]) and is_pct(c["restore_ms"])
    assert p["graph_step_ms"] > 0 and p["eager_step_ms"] is None  # NumPy has no eager/graph split
    s = bench_gpu.summary([p])
    assert set(s["replan_ms"]) == set(s["copy_fork_over_shared"]) == {"4x4@128"}
    assert set(s["step_capsule_overhead"]) == {"kv_window_128"}


@pytest.mark.parametrize("argv, first_words", [
    (["gpu"], "flashrt-bench gpu: no usable CUDA device: cupy is not importable"),
    (["runtime", "--quick", "--backend", "cuda"],
     "flashrt-bench runtime: backend 'cuda' requested but unavailable: cupy is not importable"),
])
def test_gpu_benches_without_a_device_exit_with_one_clear_line(tmp_path, argv, first_words):
    """On every machine, a GPU one too: a process where CuPy cannot be imported."""
    import os

    from ros_harness import env_without_module
    env = env_without_module(dict(os.environ, PYTHONPATH=str(ROOT)), tmp_path / "shim", "cupy")
    res = subprocess.run([sys.executable, "-m", "flashrt_ros.tools.bench", *argv], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 1, res.stdout[-1000:] + res.stderr[-2000:]
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(first_words), res.stderr[-2000:]


def test_the_gpu_check_script_without_a_device_runs_every_part_and_fails_naming_why(tmp_path):
    """scripts/gpu_check.sh (make gpu-check) where CuPy cannot be imported: the tests skip, each bench
    says why in one line, every part leaves its log, and the check exits non-zero."""
    import os

    from ros_harness import env_without_module
    env = env_without_module(dict(os.environ, OUT=str(tmp_path / "out"), GPU_PY=sys.executable),
                             tmp_path / "shim", "cupy")
    res = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh")], env=env, capture_output=True, text=True,
                         timeout=300)
    assert res.returncode != 0, res.stdout[-3000:]
    assert "== gpu_tests: exit 0" in res.stdout and "== bench_gpu: exit 1" in res.stdout, res.stdout[-3000:]
    assert "== bench_runtime_cuda: exit 1" in res.stdout, res.stdout[-3000:]
    logs = {p.name: p.read_text() for p in (tmp_path / "out").glob("*.log")}
    assert set(logs) == {"env.log", "gpu_tests.log", "bench_gpu.log", "bench_runtime_cuda.log"}
    assert " skipped" in logs["gpu_tests.log"] and " passed" not in logs["gpu_tests.log"]
    assert "no usable CUDA device" in logs["bench_gpu.log"]
    assert "backend 'cuda' requested but unavailable" in logs["bench_runtime_cuda.log"]


@pytest.mark.gpu
@pytest.mark.skipif(cuda_probe() is not None, reason=f"no CUDA device: {cuda_probe()}")
def test_quick_runtime_bench_runs_on_cuda_with_an_exact_restore(tmp_path):
    out = tmp_path / "runtime_cuda.json"
    res = subprocess.run([sys.executable, "-m", "flashrt_ros.tools.bench", "runtime", "--quick", "--backend", "cuda",
                          "--json", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    data = json.loads(out.read_text())
    assert data["backend"] == "cuda" and data["full_restore_max_abs_diff"] == 0.0
    assert data["kv_only_max_abs_diff"] > 1e-3 and is_pct(data["step_latency_ms"])


def test_each_replan_case_reports_its_roofline_floor_from_its_flops_bytes_and_the_core_peaks(quick):
    from flashrt_ros.tools.bench.floor import replan_floor
    data = quick[0]
    peaks, cfg = data["core_peaks"], PolicyConfig()
    assert peaks["gflop_per_s"] > 0 and peaks["gbyte_per_s"] > 0
    assert set(data["replan_floor"]) == set(data["replan_ms"])
    # the compiled step holds the seeded (bf16-valued) matrices at 16 bits: it reads less than the slab holds
    read, held = data["model"]["weight_bytes_read"], data["model"]["weight_bytes"]
    assert 0 < read < held if data["backend"] == "cpu" else read == held
    for case, floor in data["replan_floor"].items():
        b, h = (int(v) for v in case.split("@")[0].split("x"))
        kv_len = data["replan_detail"][case]["kv_len"]
        window = 2 * kv_len * cfg.d_model * cfg.n_layers  # K and V entries a row reads
        assert floor["flops_per_batched_step"] == 2 * b * (data["model"]["weight_bytes"] // 4 + window)
        assert floor["bytes_per_batched_step"] == data["model"]["weight_bytes_read"] + 4 * window
        assert floor == {**replan_floor(b, h, kv_len, cfg.d_model, cfg.n_layers, data["model"]["weight_bytes"],
                                        peaks, data["model"]["weight_bytes_read"]),
                         "p50_over_floor": floor["p50_over_floor"]}
        assert floor["p50_over_floor"] == round(data["replan_ms"][case]["p50"] / floor["floor_ms"], 2)
