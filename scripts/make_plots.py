"""`make plots`: the README's figures, redrawn from short real runs of the command-line tools.

    python scripts/make_plots.py [OUT_DIR]     (default out/plots/img; the JSON of each run goes to out/plots/)

The README's own figures (docs/img/, tracked) are replaced only when asked: `make plots PLOTS_DIR=docs/img`.

Each figure comes from the tool's own --plot, run as a user would run it; ROS runs need ROS_LOG_DIR and
ROS_AUTOMATIC_DISCOVERY_RANGE=LOCALHOST (the Makefile sets both).
"""
from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def tool(name: str, *args, ok=(0,)) -> None:
    cmd = [str(BIN / name), *map(str, args)]
    print("+", " ".join(cmd), flush=True)
    rc = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.DEVNULL).returncode
    if rc not in ok:
        sys.exit(f"make_plots: {name} exited {rc}")


def main(argv) -> int:
    img = Path(argv[0]) if argv else ROOT / "out" / "plots" / "img"
    js = ROOT / "out" / "plots"
    js.mkdir(parents=True, exist_ok=True)
    img.mkdir(parents=True, exist_ok=True)
    tool("flashrt-bench", "capsules", "--json", js / "capsules.json", "--plot", img / "capsule_lineage.png")
    # the Results table's own run (`make bench`, every history it lists), so figure and table agree point by point
    from flashrt_ros.tools.plots.figures import bench_persist, bench_runtime

    bench_runtime(json.loads((ROOT / "docs" / "results" / "cpu_bench_runtime.json").read_text()),
                  img / "bench_runtime.png")
    tool("flashrt-bench", "ros", "--calls", "300", "--json", js / "bench_ros.json", "--plot", img / "bench_ros.png")
    # the table's run too (`make bench-persist` keeps its samples): a fresh run on a loaded machine draws load
    bench_persist(json.loads((ROOT / "docs" / "results" / "cpu_bench_persist.json").read_text()),
                  img / "bench_persist.png")
    tool("flashrt-demo", "--mission", "trace", "--duration", "15", "--json", js / "mission.json", "--plot",
         img / "mission.png")

    from flashrt_ros.tools.common import synthetic_trace
    from flashrt_ros.tools.replay.bags import write_joint_trace

    with tempfile.TemporaryDirectory(prefix="flashrt-plots.") as tmp:
        tmp = Path(tmp)
        obs = synthetic_trace(200, 14)  # 2 s at 100 Hz
        other = obs.copy()
        other[100:, 0] += 0.5  # the same recording, one joint offset from 1 s on
        write_joint_trace(tmp / "a.mcap", "mcap", obs)
        write_joint_trace(tmp / "b.mcap", "mcap", other)
        tool("flashrt-replay", tmp / "a.mcap", "--out", tmp / "run_a")
        tool("flashrt-replay", tmp / "b.mcap", "--out", tmp / "run_b")
        tool("flashrt-replay", "diff", tmp / "run_a", tmp / "run_b", "--plot", img / "replay_diff.png", ok=(1,))
    print(f"figures in {img}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
