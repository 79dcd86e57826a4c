"""flashrt-demo: the arm mission through ROS 2 (default: the MuJoCo arm, the shipped policy, sensor faults and
their rollback corrections), the synthetic-trace mission (`--mission trace`, for the latency benches), or the
ROS-free runtime demo (`--runtime`)."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ..common import add_backend_argument


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="flashrt-demo", description=__doc__)
    ap.add_argument("--runtime", action="store_true", help="the runtime demo only, no ROS processes")
    ap.add_argument("--mission", choices=("arm", "trace"), default="arm",
                    help="arm: the simulated arm with sensor faults and rollback corrections; trace: a synthetic "
                    "100 Hz sensor and a planner that rolls back and re-plans every 0.5 s (the latency benches)")
    ap.add_argument("--duration", type=float, help="mission length in seconds (ROS demo; the arm's in sim time): "
                    "default 30 for the arm, 20 for the trace")
    ap.add_argument("--episode-s", type=float, default=10.0, help="arm: seconds of sim time per episode")
    ap.add_argument("--seed", type=int, help="arm: the first episode's seed (default 2^32, the held-out seeds)")
    ap.add_argument("--no-correction", action="store_true",
                    help="arm: the same faults, corrections counted but no replan (the ablation)")
    ap.add_argument("--verbose", action="store_true", help="arm: the planner's line per correction on stdout")
    ap.add_argument("--steps", type=int, default=300,
                    help="trace length (runtime demo), at least 2; it rolls back min(50, steps // 2) steps")
    add_backend_argument(ap, "auto")
    ap.add_argument("--cpu-load", type=int, default=0, metavar="N",
                    help="trace mission: also run N processes that each keep one core busy (the robot's other work)")
    ap.add_argument("--thread-priority", type=int, default=0, metavar="N",
                    help="trace mission: start the node with thread_priority:=N (SCHED_FIFO stepping thread; 0 = off)")
    ap.add_argument("--replan-nice", type=int, default=0, metavar="N",
                    help="trace mission: start the node with replan_nice:=N (nice value of the replan worker; 0 = off)")
    ap.add_argument("--config", help="params file (default: the shipped config/flashrt.yaml values)")
    ap.add_argument("--json", help="write the summary JSON here")
    ap.add_argument("--plot", metavar="FILE.png", help="also draw the run into this PNG (needs matplotlib): the "
                    "arm's trajectory against the goal with faults, corrections and commits (--mission trace: the "
                    "mission timeline), or with --runtime the steps, the rollback and the what-if branches")
    args = ap.parse_args(argv)
    if args.plot:
        from ..plots.figures import PlotUnavailable, require_matplotlib
        try:
            require_matplotlib()  # before the run, not after it
        except PlotUnavailable as e:
            print(f"flashrt-demo: {e}", file=sys.stderr)
            return 2
    if args.runtime:
        from .runtime import MIN_STEPS, run
        if args.steps < MIN_STEPS:  # refused up front, before any allocation
            ap.error(f"--steps must be at least {MIN_STEPS} (the demo rolls back within the trace)")
    else:
        if args.duration is None:
            args.duration = 30.0 if args.mission == "arm" else 20.0
        if args.mission == "arm":
            # the one import of the sim from the demo (.importlinter): here, so MuJoCo stays optional
            from ...sim.ros_mission import run
            if not args.episode_s > 0:
                ap.error("--episode-s must be > 0 seconds")
        else:
            from .mission import run
        if not args.duration > 0:
            ap.error("--duration must be > 0 seconds")
        if not 0 <= args.thread_priority <= 99:
            ap.error("--thread-priority must be 0 (off) to 99")
        if not 0 <= args.replan_nice <= 19:
            ap.error("--replan-nice must be 0 (off) to 19")
        if args.cpu_load < 0:
            ap.error("--cpu-load must be >= 0 processes")
    from ..common import sigterm_as_interrupt
    from ..machine import load_average, with_machine
    sigterm_as_interrupt()
    try:
        load_before = load_average()
        result = run(args)
        summary = with_machine(result, result.get("backend", args.backend), load_before)  # what auto resolved to
    except KeyboardInterrupt as e:  # SIGINT, or SIGTERM (sigterm_as_interrupt): what the run measured so far
        from ..common import interrupted
        return interrupted("flashrt-demo", e, args.json)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(summary, indent=2) + "\n")
    if args.plot:
        from ..plots import runs as plots_runs
        try:
            if args.runtime:
                plots_runs.runtime_demo(summary, args.plot)
            elif args.mission == "arm":
                from ..plots.arm import arm_trajectory
                arm_trajectory(summary, args.plot)
            else:
                plots_runs.mission_timeline(summary, args.plot)
        except ValueError as e:  # a failed mission has nothing to draw: say so, the summary says why
            print(f"flashrt-demo: --plot: {e}", file=sys.stderr)
            return 1
    return 0 if summary.get("ok", True) else 1


if __name__ == "__main__":
    sys.exit(main())
