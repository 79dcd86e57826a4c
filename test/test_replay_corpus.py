"""flashrt-replay over a corpus of bags: every bag replayed in worker processes (or Ray tasks), one summary
row per bag, a failing bag reported while the others still run, and the corpus exit code saying whether
any failed. --jobs 2 gives the rows of --jobs 1."""
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fixtures.make_bags import PERIOD_NS, T0_NS, trace, write_joint_bag
from fixtures.replay_cli import ROOT, config_with, replay

from flashrt_ros.tools.replay import bags
from flashrt_ros.tools.replay.bags import write_joint_trace

STEPS = 80
GOOD = ["arm_mcap", "arm_sqlite3", "with_rejects"]
ROLLBACK = ["--rollback-every", 30, "--rollback-depth", 10]


def good_bags(d):
    """arm_mcap: one loose .mcap file; arm_sqlite3 and with_rejects: rosbag2 directories."""
    d.mkdir(exist_ok=True)
    obs = trace(STEPS)
    staging = write_joint_trace(d / ".staging", "mcap", obs, T0_NS, PERIOD_NS)
    next(staging.glob("*.mcap")).rename(d / "arm_mcap.mcap")
    shutil.rmtree(staging)
    write_joint_trace(d / "arm_sqlite3", "sqlite3", obs, T0_NS, PERIOD_NS)
    write_joint_bag(d / "with_rejects", "mcap", STEPS, bad_every=20)
    return d


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """Three good bags and one cut short (a recorder killed mid-write): unreadable, exit 2 on its own."""
    d = good_bags(tmp_path_factory.mktemp("corpus"))
    whole = (d / "arm_mcap.mcap").read_bytes()
    (d / "cut_short.mcap").write_bytes(whole[: len(whole) // 3])
    return d


@pytest.fixture(scope="module")
def cfg(tmp_path_factory):
    """The shipped config with a 32 MB store: every bag's replay faulted in its 512 MB (~0.4 CPU-s), and 80 steps
    fit in far less."""
    return config_with(tmp_path_factory.mktemp("config"), capsule_budget_mb=32.0)


def run_corpus(spec, *args, cfg, expect, tmp_path, name="s.json", timeout=300):
    _, res = replay(spec, *args, "--config", cfg, "--json", tmp_path / name, expect=expect, timeout=timeout)
    return json.loads((tmp_path / name).read_text()), res


def without_timing(rows):
    return [{k: v for k, v in r.items() if k != "wall_s"} for r in rows]


def test_a_failing_bag_is_reported_the_others_still_run_and_the_exit_code_says_so(corpus, cfg, tmp_path):
    out = tmp_path / "out"
    s, res = run_corpus(corpus, "--jobs", 2, "-o", out, *ROLLBACK, cfg=cfg, expect=1, tmp_path=tmp_path)
    rows = {r["bag"]: r for r in s["rows"]}
    assert sorted(rows) == sorted(GOOD + ["cut_short"]) and s["failed"] == ["cut_short"]
    bad = rows.pop("cut_short")
    assert bad["exit_code"] == 2 and "cannot read bag" in bad["error"] and bad["steps"] is None
    for name, r in rows.items():
        assert r["exit_code"] == 0 and r["error"] is None, r
        assert r["checks"]["run"] == r["checks"]["passed"] > 0 and r["steps"] > 0
        assert (out / name / "metadata.yaml").is_file()  # one output bag per bag name
    assert rows["with_rejects"]["steps"] < rows["with_rejects"]["messages"] == STEPS  # rejects are not failures
    # the table: a header and one line per bag, the failing bag's reason under it
    table = res.stdout.splitlines()
    assert table[0].split() == ["bag", "steps", "checks", "first", "divergence", "exit"]
    assert [ln.split()[0] for ln in table[1:5]] == sorted(GOOD + ["cut_short"])
    assert table[3].split() == ["cut_short", "-", "-", "-", "2"] and table[5].startswith("cut_short: ")
    assert json.loads((out / "summary.json").read_text())["rows"] == s["rows"]
    assert (out / "summary.txt").read_text().strip() == res.stdout.strip()


@pytest.fixture(scope="module")
def jobs_1(corpus, cfg, tmp_path_factory):
    """The corpus replayed by one worker (the summary), the rows --jobs 2 and Ray must give: read-only."""
    return run_corpus(corpus, "--jobs", 1, *ROLLBACK, cfg=cfg, expect=1, tmp_path=tmp_path_factory.mktemp("jobs_1"),
                      name="one.json")[0]


def test_jobs_2_gives_the_rows_of_jobs_1(corpus, cfg, jobs_1, tmp_path):
    one = jobs_1
    two, _ = run_corpus(corpus, "--jobs", 2, *ROLLBACK, cfg=cfg, expect=1, tmp_path=tmp_path, name="two.json")
    assert without_timing(one["rows"]) == without_timing(two["rows"])
    assert (one["workers"], two["workers"]) == (1, 2)


def test_reference_diff_names_the_first_divergence_per_bag(cfg, tmp_path):
    ref_bags = good_bags(tmp_path / "ref_bags")
    ref = tmp_path / "reference"
    replay(ref_bags, "--jobs", 2, "--config", cfg, "-o", ref, expect=0)
    # the same corpus again, one recording changed from step 30 on and one with no reference
    new = tmp_path / "new_bags"
    shutil.copytree(ref_bags, new)
    shutil.rmtree(new / "arm_sqlite3")
    changed = trace(STEPS)
    changed[30:, 0] += 0.5
    write_joint_trace(new / "arm_sqlite3", "sqlite3", changed, T0_NS, PERIOD_NS)
    shutil.copy(new / "arm_mcap.mcap", new / "brand_new.mcap")
    s, res = run_corpus(new, "--jobs", 2, "--reference", ref, cfg=cfg, expect=1, tmp_path=tmp_path)
    rows = {r["bag"]: r for r in s["rows"]}
    assert rows["arm_mcap"]["reference"] == rows["with_rejects"]["reference"] == "identical"
    assert rows["arm_mcap"]["exit_code"] == rows["with_rejects"]["exit_code"] == 0
    div = rows["arm_sqlite3"]
    assert div["exit_code"] == 1 and div["first_divergence"]["index"] == 30 and div["first_divergence"]["step"] == 31
    assert rows["brand_new"]["exit_code"] == 2 and rows["brand_new"]["reference"] == "missing"
    assert sorted(s["failed"]) == ["arm_sqlite3", "brand_new"]
    assert "index 30 (step 31)" in res.stdout


def test_a_glob_of_good_bags_exits_0(corpus, cfg, tmp_path):
    s, _ = run_corpus(str(corpus / "arm_*"), cfg=cfg, expect=0, tmp_path=tmp_path)
    assert [r["bag"] for r in s["rows"]] == ["arm_mcap", "arm_sqlite3"] and s["failed"] == []


@pytest.mark.parametrize("case", ["nothing_matches", "output_exists", "no_reference_dir", "live", "two_of_a_name"])
def test_a_bad_corpus_is_refused_up_front_with_exit_2(corpus, tmp_path, case):
    spec, extra = corpus, []
    if case == "nothing_matches":
        spec = str(tmp_path / "none_*")
    elif case == "output_exists":
        (tmp_path / "out").mkdir()
        extra = ["-o", tmp_path / "out"]
    elif case == "no_reference_dir":
        extra = ["--reference", tmp_path / "nope"]
    elif case == "live":
        extra = ["--mode", "live"]
    else:
        (tmp_path / "a").mkdir()
        (tmp_path / "b").mkdir()
        shutil.copy(corpus / "arm_mcap.mcap", tmp_path / "a")
        shutil.copy(corpus / "arm_mcap.mcap", tmp_path / "b")
        spec = str(tmp_path / "*" / "arm_mcap.mcap")
    _, res = replay(spec, "--jobs", 2, *extra, expect=2)
    assert res.stderr.strip() and res.stdout == ""
    if case == "output_exists":
        assert list((tmp_path / "out").iterdir()) == []


@pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="ray is not installed (pip install ray)")
def test_ray_gives_the_rows_of_local_workers(corpus, cfg, jobs_1, tmp_path):
    """A local Ray, started by the command itself (no cluster running), 2 CPUs."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["RAY_USAGE_STATS_ENABLED"] = "0"
    local = jobs_1
    _, res = replay(corpus, "--ray", "auto", "--jobs", 2, *ROLLBACK, "--config", cfg, "--json", tmp_path / "ray.json",
                    env=env, expect=1, timeout=600)
    on_ray = json.loads((tmp_path / "ray.json").read_text())
    assert on_ray["engine"] == "ray (auto)" and on_ray["failed"] == ["cut_short"]
    assert without_timing(on_ray["rows"]) == without_timing(local["rows"])


def _worker_pids(parent: int) -> list[int]:
    """The flashrt-replay processes the corpus started (its children), from /proc."""
    pids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[1]) == parent:
                pids.append(int(stat.parent.name))
        except (OSError, IndexError, ValueError):
            continue
    return pids


def test_sigterm_stops_every_running_worker_and_leaves_no_unfinished_output(tmp_path):
    bags = tmp_path / "bags"
    bags.mkdir()
    for i in range(3):  # long enough that the workers are still running when the signal comes
        write_joint_trace(bags / f"long{i}", "mcap", trace(20_000, seed=i), T0_NS, PERIOD_NS)
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-m", "flashrt_ros.tools.replay", str(bags), "--jobs", "2", "-o",
                             str(out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        while len(workers := _worker_pids(proc.pid)) < 2:  # both workers started
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143 and "interrupted by SIGTERM" in err, err[-2000:]
    assert all(not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2]
               for pid in workers)  # every worker ended with the corpus
    assert not [p for p in out.iterdir() if p.is_dir()]  # their unfinished output bags were removed


def test_a_fifo_or_a_link_loop_in_a_corpus_is_one_failed_row_never_a_hang(cfg, tmp_path):
    """Issue 44.4: a FIFO named as a bag once hung the corpus (no exit in 150 s: its worker waited on the FIFO
    for a writer), and a link loop ended it with exit 4 (an internal error)."""
    d = tmp_path / "corpus"
    d.mkdir()
    staging = write_joint_trace(d / ".staging", "mcap", trace(20), T0_NS, PERIOD_NS)
    next(staging.glob("*.mcap")).rename(d / "good.mcap")
    shutil.rmtree(staging)
    os.mkfifo(d / "fifo.mcap")
    (d / "loop.mcap").symlink_to("loop.mcap")
    (d / "fifo_dir").mkdir()  # a bag directory whose storage file is a FIFO
    (d / "fifo_dir" / "metadata.yaml").write_text("rosbag2_bagfile_information: {relative_file_paths: [x.mcap]}\n")
    os.mkfifo(d / "fifo_dir" / "x.mcap")
    os.mkfifo(tmp_path / "metadata.yaml")  # a FIFO as metadata.yaml is read as no metadata, not waited on
    assert bags._read_metadata(tmp_path) == {}
    # its own process group, so a hang is a failure in 120 s (with its workers ended), not a test that never ends
    proc = subprocess.Popen([sys.executable, "-m", "flashrt_ros.tools.replay", d, "--jobs", "2", "--config", cfg,
                             "--json", tmp_path / "s.json"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        _, err = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail("the corpus with a FIFO and a link loop did not end in 120 s")
    assert proc.returncode == 1 and "Traceback" not in err, err[-3000:]
    s = json.loads((tmp_path / "s.json").read_text())
    rows = {r["bag"]: r for r in s["rows"]}
    assert sorted(rows) == ["fifo", "fifo_dir", "good", "loop"] and s["failed"] == ["fifo", "fifo_dir", "loop"]
    assert rows["good"]["exit_code"] == 0 and rows["good"]["steps"] == 20
    assert rows["fifo"]["exit_code"] == 2 and "fifo.mcap: a FIFO, not a bag file" in rows["fifo"]["error"]
    assert rows["fifo_dir"]["exit_code"] == 2 and "x.mcap: a FIFO, not a bag file" in rows["fifo_dir"]["error"]
    assert rows["loop"]["exit_code"] == 2 and "symbolic links" in rows["loop"]["error"], rows["loop"]
