"""Every --plot draws a real PNG from a short real run (it exists, decodes, is not blank), and without
matplotlib the option fails up front with one line that says how to install it."""
import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from fixtures.replay_cli import TINY_CONFIG, config_with, replay_in_process

from conftest import ROOT


def run_tool(module: str, *args, env=None, timeout=300) -> subprocess.CompletedProcess:
    if module == "replay" and env is None:  # main(argv) in this process: a process start saved per call
        return replay_in_process(*args)
    return subprocess.run([sys.executable, "-m", f"flashrt_ros.tools.{module}", *map(str, args)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


def assert_drawn(png) -> np.ndarray:
    """The file exists, decodes as an image, and holds a drawing: pixels vary and more than a sliver
    of them is not background."""
    from matplotlib.image import imread

    assert png.is_file() and png.stat().st_size > 0, png
    img = imread(png)
    assert img.ndim == 3 and img.shape[0] > 100 and img.shape[1] > 100, img.shape
    rgb = img[..., :3].astype(np.float64)
    assert rgb.var() > 0
    assert (rgb.min(axis=2) < 0.9).mean() > 0.01, "almost every pixel is white"
    return img


def make_bags(tmp_path, n=120, diverge_at=60):
    """Two JointState bags, the same up to ``diverge_at``, then one joint offset."""
    from flashrt_ros.tools.common import synthetic_trace
    from flashrt_ros.tools.replay.bags import write_joint_trace

    obs = synthetic_trace(n, 14)
    other = obs.copy()
    other[diverge_at:, 0] += 0.05
    return write_joint_trace(tmp_path / "a.mcap", "mcap", obs), write_joint_trace(tmp_path / "b.mcap", "mcap", other)


def replay_policy(tmp_path, bag, *args) -> subprocess.CompletedProcess:
    """flashrt-replay of ``bag`` with a one-layer policy (same obs and action dims as the default): the figure
    is the subject here, and the default config's 512 MB store took 1-7 s to fault in at every run."""
    cfg = tmp_path / "tiny.yaml"
    if not cfg.exists():
        config_with(tmp_path, cfg.name, base=TINY_CONFIG)
    return run_tool("replay", bag, "--config", cfg, *args)


# ---- benchmarks ------------------------------------------------------------------------------------------
def test_bench_runtime_plot_draws_the_three_panels_from_a_quick_run(tmp_path):
    res = run_tool("bench", "runtime", "--quick", "--json", tmp_path / "r.json", "--plot", tmp_path / "r.png")
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads((tmp_path / "r.json").read_text())
    assert [h["history"] for h in out["histories"]] == [128, 256]
    assert_drawn(tmp_path / "r.png")


def test_bench_capsules_plot_draws_a_tree_with_rollbacks_replans_pins_and_evictions(tmp_path):
    res = run_tool("bench", "capsules", "--json", tmp_path / "c.json", "--plot", tmp_path / "c.png")
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads((tmp_path / "c.json").read_text())
    caps = {c["id"]: c for c in out["capsules"]}
    kinds = [e["kind"] for e in out["events"]]
    assert kinds.count("rollback") == 3 and kinds.count("replan") == 3 and "pin" in kinds
    assert out["evicted"] > 0 and out["held"] == out["capacity"]  # the small store filled and evicted
    pinned = [c for c in caps.values() if c["ever_pinned"]]
    assert len(pinned) == 1 and not pinned[0]["evicted"]  # the pin kept it through every eviction
    assert any(c["label"].startswith("replan branch") and not c["evicted"] for c in caps.values())
    # every held capsule's parent was seen: the tree has no dangling edge
    assert all(c["parent_id"] in caps for c in caps.values() if c["parent_id"])
    assert_drawn(tmp_path / "c.png")


def test_capsule_lanes_continue_the_timeline_and_open_one_per_rollback_and_branch():
    from flashrt_ros.tools.plots.lineage import assign_lanes

    def cap(i, parent, label=""):
        return {"id": i, "parent_id": parent, "label": label}
    # 1-2-3 on a timeline; 4 is a rollback's new future from 2; 5 a replan branch of 3; 6 continues 3
    lanes = assign_lanes([cap(1, 0), cap(2, 1), cap(3, 2), cap(4, 2), cap(5, 3, "replan branch 0"), cap(6, 3)])
    assert lanes[1] == lanes[2] == lanes[3] == lanes[6] == 0
    assert lanes[4] == 1 and lanes[5] == 2


@pytest.mark.ros
def test_bench_ros_plot_draws_the_cdfs_of_every_round_trip(ros_domain, tmp_path):
    res = run_tool("bench", "ros", "--calls", 30, "--json", tmp_path / "r.json", "--plot", tmp_path / "r.png",
                   env=ros_domain)
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads((tmp_path / "r.json").read_text())
    assert {k: len(v) for k, v in out["samples_ms"].items()} == dict.fromkeys(
        ("trigger_rtt", "rollback_rtt", "replan_rtt", "step_latency"), 30)
    assert out["trigger_rtt"]["p50"] == pytest.approx(np.percentile(out["samples_ms"]["trigger_rtt"], 50), abs=1e-3)
    assert_drawn(tmp_path / "r.png")


def test_bench_persist_plot_draws_the_step_cdfs_and_the_records_lost_per_kill(tmp_path):
    # one kill and a short resume log: the figure draws a point per kill whatever their number (test_bench_persist
    # runs the quick sizes themselves)
    res = run_tool("bench", "persist", "--quick", "--kills", 1, "--resume-steps", 300, "--json", tmp_path / "p.json",
                   "--plot", tmp_path / "p.png")
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads((tmp_path / "p.json").read_text())
    over = out["persist_step_overhead"]
    assert {k: len(v) for k, v in out["samples_ms"].items()} == dict.fromkeys(("with", "without"),
                                                                              over["steps_per_arm"])
    assert over["with_persistence_ms"]["p99"] == pytest.approx(np.percentile(out["samples_ms"]["with"], 99),
                                                                abs=1e-3)
    assert_drawn(tmp_path / "p.png")


# ---- demos -------------------------------------------------------------------------------------------------
def small_store(tmp_path):
    """The shipped config with a 32 MB store: its default 512 MB took ~1.5 CPU-s to fault in per run; 32 MB holds
    the KV pages its window and branches need (17.6 MB) and the demo's capsules."""
    return config_with(tmp_path, "small-store.yaml", capsule_budget_mb=32.0)


def test_runtime_demo_plot_draws_the_steps_and_the_what_if_branches(tmp_path):
    res = run_tool("demo", "--runtime", "--steps", 60, "--config", small_store(tmp_path), "--json", tmp_path / "d.json",
                   "--plot", tmp_path / "d.png")
    assert res.returncode == 0, res.stderr[-3000:]
    s = json.loads((tmp_path / "d.json").read_text())
    assert len(s["samples"]["step_latency_ms"]) == 60 and len(s["samples"]["replan_action0"]) == 4
    assert_drawn(tmp_path / "d.png")


def test_runtime_demo_json_has_no_samples_without_plot(tmp_path):
    res = run_tool("demo", "--runtime", "--steps", 20, "--config", small_store(tmp_path), "--json", tmp_path / "d.json")
    assert res.returncode == 0, res.stderr[-3000:]
    assert "samples" not in json.loads((tmp_path / "d.json").read_text())


@pytest.mark.ros
def test_mission_plot_draws_the_timeline_of_steps_rollbacks_and_replans(ros_domain, tmp_path):
    """Also the mission demo's own end-to-end check (three processes, a clean exit, byte-exact checks
    passed): one run of the demo serves both, as the plot is drawn from that run's JSON."""
    res = run_tool("demo", "--mission", "trace", "--duration", 5, "--json", tmp_path / "m.json", "--plot",
                   tmp_path / "m.png",
                   env=ros_domain)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    s = json.loads((tmp_path / "m.json").read_text())
    assert s["ok"] and s["node_exit_code"] == 0 and not s["node_traceback"]
    assert s["steps"] > 200 and s["rounds"] >= 5 and s["commits"] >= 1
    assert s["byte_exact_checks"]["run"] == s["byte_exact_checks"]["passed"]
    assert {"step_latency_ms", "rollback_ms", "replan_ms", "deadline_misses", "rejected"} <= set(s)
    tl = s["timeline"]
    # one replan per round, unless the round timed out (a timeout in the repeat comes after its replan)
    assert len(tl["steps"]) == s["steps"] and s["rounds"] - s["timeouts"] <= len(tl["replans"]) <= s["rounds"]
    assert sum(1 for r in tl["replans"] if r[2]) >= s["commits"] >= 1
    assert tl["rollbacks"]
    assert_drawn(tmp_path / "m.png")


# ---- replay ------------------------------------------------------------------------------------------------
def test_replay_plot_keeps_its_json_and_diff_plot_marks_the_first_divergence(tmp_path):
    a, b = make_bags(tmp_path)
    res = replay_policy(tmp_path, a, "--out", tmp_path / "ra", "--plot", tmp_path / "ra.png")
    assert res.returncode == 0, res.stderr[-3000:]
    assert "trace" not in json.loads(res.stdout)  # the per-step trace goes to the figure, not the summary
    assert_drawn(tmp_path / "ra.png")
    assert replay_policy(tmp_path, b, "--out", tmp_path / "rb").returncode == 0
    res = run_tool("replay", "diff", tmp_path / "ra", tmp_path / "rb", "--plot", tmp_path / "diff.png")
    assert res.returncode == 1, res.stderr[-3000:]
    assert json.loads(res.stdout)["first_diverging_index"] == 60
    assert_drawn(tmp_path / "diff.png")


def test_replay_diff_plot_of_identical_runs_draws_without_a_divergence(tmp_path):
    a, _ = make_bags(tmp_path, n=40)
    for out in ("r1", "r2"):
        assert replay_policy(tmp_path, a, "--out", tmp_path / out).returncode == 0
    res = run_tool("replay", "diff", tmp_path / "r1", tmp_path / "r2", "--plot", tmp_path / "same.png")
    assert res.returncode == 0 and json.loads(res.stdout)["identical"], res.stderr[-3000:]
    assert_drawn(tmp_path / "same.png")


def test_trace_recorder_keeps_bounded_evenly_spaced_rows():
    from flashrt_ros.tools.plots.runs import TraceRecorder

    tr = TraceRecorder(limit=64)
    for i in range(1000):
        tr.add(i + 1, i * 10, 0.5, np.full(6, i, np.float32))
    d = tr.to_dict()
    assert d["steps"] == 1000 and len(d["index"]) <= 64
    assert d["index"][0] == 0 and set(np.diff(d["index"])) == {d["stride"]}
    assert d["action"][5] == [d["index"][5]] * 6  # rows stay aligned; every action dimension kept


# ---- what the figures show (data level: the matplotlib objects, not pixels) --------------------------------
def _trace(n, dims, offset_from=None, period_ns=10_000_000):
    from flashrt_ros.tools.plots.runs import TraceRecorder

    tr = TraceRecorder()
    for i in range(n):
        a = np.sin(np.arange(dims) + i / 10.0)
        if offset_from is not None and i >= offset_from:
            a[0] += 0.5
        tr.add(i + 1, 1_700_000_000_000_000_000 + i * period_ns, 0.5, a)
    return tr.to_dict()


def _diff_report(n, first):
    return {"identical": first is None, "a_steps": n, "b_steps": n, "compared": n, "differing_steps": n - first,
            "first_diverging_index": first, "first_diverging_step": first + 1}


def test_replay_diff_draws_every_dimension_over_bag_time_in_seconds():
    from flashrt_ros.tools.plots.runs import draw_replay_diff

    fig = draw_replay_diff(_diff_report(300, 150), _trace(300, 7), _trace(300, 7, offset_from=150))
    axes = fig.axes
    assert len(axes) == 8  # 7 action dimensions + the difference
    assert [ax.get_ylabel() for ax in axes[:7]] == [f"action[{d}]" for d in range(7)]
    assert axes[-1].get_xlabel().startswith("bag time, s")
    for ax in axes[:7]:
        a, b = (ln for ln in ax.get_lines() if ln.get_label() in ("A", "B"))
        assert np.allclose(a.get_xdata(), np.arange(300) * 0.01) and len(b.get_xdata()) == 300  # seconds, 100 Hz
    first = [ln for ln in axes[0].get_lines() if ln.get_label() == "first divergence"]
    assert len(first) == 1 and first[0].get_xdata()[0] == pytest.approx(1.5)  # index 150 at 100 Hz
    pyplot_close(fig)


def test_replay_diff_joints_draws_only_those_and_refuses_a_missing_one():
    from flashrt_ros.tools.plots.runs import draw_replay_diff

    a, b = _trace(50, 7), _trace(50, 7, offset_from=20)
    fig = draw_replay_diff(_diff_report(50, 20), a, b, joints=[3, 0])
    assert [ax.get_ylabel() for ax in fig.axes[:-1]] == ["action[3]", "action[0]"]
    pyplot_close(fig)
    with pytest.raises(ValueError, match="7 dimensions"):
        draw_replay_diff(_diff_report(50, 20), a, b, joints=[0, 7])


def test_replay_diff_joints_on_the_command_line(tmp_path):
    a, b = make_bags(tmp_path, n=40, diverge_at=20)
    for bag, out in ((a, "ra"), (b, "rb")):
        assert replay_policy(tmp_path, bag, "--out", tmp_path / out).returncode == 0
    res = run_tool("replay", "diff", tmp_path / "ra", tmp_path / "rb", "--plot", tmp_path / "d.png", "--joints", "0,3")
    assert res.returncode == 1, res.stderr[-3000:]
    assert_drawn(tmp_path / "d.png")
    res = run_tool("replay", "diff", tmp_path / "ra", tmp_path / "rb", "--plot", tmp_path / "bad.png",
                   "--joints", "0,99")
    assert res.returncode == 2 and "not 99" in res.stderr and not (tmp_path / "bad.png").exists()
    # one replay: a dimension the policy does not have is refused before the run, nothing written
    res = replay_policy(tmp_path, a, "--out", tmp_path / "rc", "--plot", tmp_path / "one.png", "--joints", "7")
    assert res.returncode == 2 and "action_dim 7" in res.stderr, res.stderr[-2000:]
    assert not (tmp_path / "rc").exists() and not (tmp_path / "one.png").exists()
    res = replay_policy(tmp_path, a, "--plot", tmp_path / "one.png", "--joints", "6,0")
    assert res.returncode == 0, res.stderr[-2000:]
    assert_drawn(tmp_path / "one.png")


def pyplot_close(fig):
    from flashrt_ros.tools.plots.figures import pyplot

    pyplot().close(fig)


def _persist_result(lost):
    rng = np.random.default_rng(1)
    return {"samples_ms": {"with": list(rng.gamma(9, 0.15, 300)), "without": list(rng.gamma(9, 0.14, 300))},
            "persist_step_overhead": {"with_persistence_ms": {"p99": 2.0}, "without_persistence_ms": {"p99": 1.9},
                                      "p99_ratio": 1.05},
            "records_lost_on_kill": {"rounds": [{"lost": x} for x in lost]},
            "resume_ms": {"ms": 1600.0}, "persist_mb_per_s": {"mib_per_s": 1.5}}


@pytest.mark.parametrize("lost", [[0, 0, 0, 0, 0], [1, 0, 0, 2, 0]])
def test_bench_persist_draws_a_visible_point_per_kill_even_when_none_lost(lost):
    from flashrt_ros.tools.plots.figures import draw_bench_persist

    fig = draw_bench_persist(_persist_result(lost))
    ax = fig.axes[1]
    assert "count" in ax.get_ylabel() and ax.get_xlabel().startswith("kill -9")
    points = [ln for ln in ax.get_lines() if ln.get_marker() not in (None, "None", "")]
    assert len(points) == 1 and list(points[0].get_ydata()) == lost and len(points[0].get_xdata()) == len(lost)
    fig.canvas.draw()
    lo, hi = ax.get_ylim()
    assert lo < min(lost) and max(lost) < hi
    # every marker lies whole inside the axes (a point on the axis line would be half cut off)
    radius_px = points[0].get_markersize() / 2 * fig.dpi / 72
    box = ax.get_window_extent()
    ys = ax.transData.transform(points[0].get_xydata())[:, 1]
    assert (ys - radius_px > box.y0).all() and (ys + radius_px < box.y1).all()
    pyplot_close(fig)


def _results_table_histories_and_speedups():
    text = (ROOT / "docs" / "results.md").read_text()  # the Results tables moved there from the README
    block = text[text.index("### Rollback + re-plan vs cold recompute"):].split("\n\n")[1]
    rows = [r.split("|") for r in block.splitlines()[2:]]
    return [int(r[1]) for r in rows], [r[-2].strip().strip("*") for r in rows]


def test_bench_runtime_middle_panel_has_every_table_point_and_nothing_overlaps():
    from flashrt_ros.tools.plots.figures import draw_bench_runtime

    result = json.loads((ROOT / "docs" / "results" / "cpu_bench_runtime.json").read_text())
    histories, speedups = _results_table_histories_and_speedups()
    fig = draw_bench_runtime(result)
    ax = fig.axes[1]
    lines = {ln.get_label(): ln for ln in ax.get_lines()}
    for label in ("cold prefill (tuned, same backend)", "rollback + 8-step re-plan"):
        assert list(lines[label].get_xdata()) == histories, label  # the figure is the table's run
    texts = [t for t in ax.texts]
    assert [t.get_text() for t in texts] == speedups
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    legend = ax.get_legend().get_window_extent(renderer)
    boxes = [t.get_window_extent(renderer) for t in texts]
    frame = ax.get_window_extent(renderer)
    points = np.concatenate([ax.transData.transform(ln.get_xydata()) for ln in ax.get_lines()]
                            + [ax.transData.transform(c.get_offsets()) for c in ax.collections])
    inside = ((points[:, 0] >= legend.x0) & (points[:, 0] <= legend.x1)
              & (points[:, 1] >= legend.y0) & (points[:, 1] <= legend.y1))
    assert not inside.any(), points[inside]  # the legend covers no plotted point
    for i, b in enumerate(boxes):
        assert not b.overlaps(legend) and frame.contains(b.x0, b.y0) and frame.contains(b.x1, b.y1), texts[i]
        assert not any(b.overlaps(o) for o in boxes[i + 1:]), texts[i].get_text()
    for other in (fig.axes[0], fig.axes[2]):  # nor reaches into the neighbouring panels
        assert not legend.overlaps(other.get_window_extent(renderer))
    pyplot_close(fig)


# ---- without matplotlib ------------------------------------------------------------------------------------
BLOCK_MATPLOTLIB = """
import sys
class _Block:
    def find_spec(self, name, path=None, target=None):
        if name == "matplotlib" or name.startswith("matplotlib."):
            raise ImportError("No module named 'matplotlib' (blocked by the test)")
sys.meta_path.insert(0, _Block())
import flashrt_ros.tools.plots.figures, flashrt_ros.tools.plots.runs, flashrt_ros.tools.plots.lineage  # import fine
"""


@pytest.mark.parametrize("module, args", [
    ("bench", ["runtime", "--quick"]),
    ("bench", ["capsules"]),
    ("bench", ["ros", "--calls", "5"]),
    ("bench", ["persist", "--quick"]),
    ("demo", ["--runtime", "--steps", "20"]),
    ("demo", ["--duration", "3"]),
    ("replay", ["BAG"]),
    ("replay", ["diff", "BAG", "BAG"]),
])
def test_plot_without_matplotlib_fails_up_front_with_a_one_line_install_hint(module, args, tmp_path):
    a, _ = make_bags(tmp_path, n=10)
    png = tmp_path / "x.png"
    argv = [str(a) if x == "BAG" else x for x in args] + ["--plot", str(png)]
    code = BLOCK_MATPLOTLIB + textwrap.dedent(f"""
        from flashrt_ros.tools.{module}.cli import main
        sys.exit(main({argv!r}))
    """)
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert res.returncode == 2, res.stdout[-2000:] + res.stderr[-2000:]
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "--plot needs matplotlib" in lines[0] and "pip install matplotlib" in lines[0], lines
    assert res.stdout == "" and not png.exists()  # refused before any run: nothing measured, nothing drawn
