"""flashrt-bench: one JSON per subcommand. `runtime` (capsules, rollback + re-plan vs cold recompute, on the
session's backend: `auto` takes CUDA, else the compiled CPU step, else NumPy), `gpu` (the same on CUDA, graph vs
eager), `replay` (flashrt-replay offline), `ros` (through DDS, separate processes), `persist` (the capsule log),
`stream` (the capsule stream, replicas and failover, separate processes), `capsules` (the capsule tree of a
short in-process mission) and `task` (the Pusher task offline: faults, rollback correction, what-ifs; the sim
extra)."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ...runtime.engine.backend import BackendUnavailable
from ..common import add_backend_argument, interrupted, sigterm_as_interrupt, write_json
from ..machine import load_average, with_machine

# The backend a subcommand measures when its JSON does not say.
RUNS_ON = {"gpu": "cuda"}
STREAM_PARTS = ("stream", "failover", "seek")  # flashrt-bench stream's parts, in the order they run


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="flashrt-bench", description=__doc__)
    sub = ap.add_subparsers(dest="which", required=True)
    rt = sub.add_parser("runtime", help="capsule copies, rollback + re-plan vs cold recompute")
    rt.add_argument("--json", help="also write the JSON here")
    rt.add_argument("--histories", help="comma-separated history lengths (default 2048,4096,8192,16384; "
                    "--quick: 128,256)")
    rt.add_argument("--quick", action="store_true", help="the same measurements at toy sizes, in seconds (tests)")
    add_backend_argument(rt, "auto")
    rt.add_argument("--config", help="params file (default: built-in defaults = config/flashrt.yaml)")
    gpu = sub.add_parser("gpu", help="the same store measurements on CUDA, snapshot copy vs raw device copy, "
                         "graph vs eager launches")
    gpu.add_argument("--json", help="also write the JSON here")
    gpu.add_argument("--config", help="params file (default: built-in defaults = config/flashrt.yaml)")
    rp = sub.add_parser("replay", help="flashrt-replay offline on a 10,000-step 100 Hz bag")
    rp.add_argument("--json", help="also write the JSON here")
    rp.add_argument("--steps", type=int, default=10_000)
    ros = sub.add_parser("ros", help="service / action / step latency through ROS 2, separate processes")
    ros.add_argument("--json", help="also write the JSON here")
    ros.add_argument("--calls", type=int, default=500, help="calls per measured kind")
    add_backend_argument(ros, "auto", "the node's backend parameter, as the shipped config's: ")
    ros.add_argument("--thread-priority", type=int, default=0, metavar="N",
                     help="start the node with thread_priority:=N (SCHED_FIFO stepping thread; 0 = off)")
    ros.add_argument("--replan-nice", type=int, default=0, metavar="N",
                     help="start the node with replan_nice:=N (nice value of the replan worker, 0..19; 0 = off)")
    pe = sub.add_parser("persist", help="capsule log: step overhead, MiB/s, resume time, records lost to kill -9")
    pe.add_argument("--json", help="also write the JSON here")
    pe.add_argument("--quick", action="store_true", help="the same measurements at toy sizes, in seconds (tests)")
    pe.add_argument("--kills", type=int, help="kill -9 rounds (default 10; --quick: 2)")
    pe.add_argument("--resume-steps", type=int, help="steps in the resume log (default 60000; --quick: 1500)")
    st = sub.add_parser("stream", help="capsule stream, replicas and failover through separate processes: step "
                        "overhead, replica lag, what-if bytes, late join, kill -9 failover, --from seek")
    st.add_argument("--json", help="also write the JSON here")
    st.add_argument("--quick", action="store_true", help="the same measurements at toy sizes (tests)")
    st.add_argument("--only", action="append", choices=STREAM_PARTS, metavar="PART",
                    help=f"run only this part (repeatable; one of {', '.join(STREAM_PARTS)}; default: all). "
                    "`--only failover` repeats the 20 kill -9 takeovers alone, in minutes")
    add_backend_argument(st, "auto", "the nodes' backend parameter: ")
    task = sub.add_parser("task", help="the Pusher task offline: expert and policy success, sensor faults with and "
                          "without rollback correction, what-if selection (needs the sim extra)")
    task.add_argument("--json", help="also write the JSON here")
    task.add_argument("--episodes", type=int, default=10, help="held-out episodes per condition (default 10)")
    task.add_argument("--first-seed", type=int, default=2 ** 32, help="the first episode's seed (default 2^32, the "
                      "first held-out seed of docs/sim.md)")
    task.add_argument("--seconds", type=float, default=10.0, help="sim seconds per episode (default 10)")
    task.add_argument("--policy", help="the policy file (default: the shipped config/policies/pusher.safetensors)")
    add_backend_argument(task, "cpu", "the Session's backend: ")
    cap = sub.add_parser("capsules", help="the capsule tree of a short mission: rollbacks, replans, pins, eviction")
    cap.add_argument("--json", help="also write the JSON here")
    for p in (rt, ros, cap, pe):
        p.add_argument("--plot", metavar="FILE.png", help="also draw the results into this PNG (needs matplotlib)")
    args = ap.parse_args(argv)
    if args.which == "ros" and not 0 <= args.thread_priority <= 99:
        ap.error("--thread-priority must be 0 (off) to 99")
    if args.which == "task":
        if args.episodes < 1 or not args.seconds > 0:
            ap.error("--episodes must be >= 1 and --seconds > 0")
        if args.policy is None:
            from pathlib import Path
            args.policy = str(Path(__file__).resolve().parents[3] / "config" / "policies" / "pusher.safetensors")
    if args.which == "stream":
        args.only = [p for p in STREAM_PARTS if p in (args.only or STREAM_PARTS)]
    if args.which == "ros" and not 0 <= args.replan_nice <= 19:
        ap.error("--replan-nice must be 0 (off) to 19")
    if getattr(args, "plot", None):
        from ..plots.figures import PlotUnavailable, require_matplotlib
        try:
            require_matplotlib()  # before the run, not after it
        except PlotUnavailable as e:
            print(f"flashrt-bench: {e}", file=sys.stderr)
            return 2
    if args.which == "runtime":
        from .runtime import run
    elif args.which == "gpu":
        from .gpu import run
    elif args.which == "replay":
        from .replay import run
    elif args.which == "capsules":
        from .capsules import run
    elif args.which == "persist":
        from .persist import run
    elif args.which == "stream":
        from .stream import run
    elif args.which == "task":
        from .task import run
    else:
        from .ros import run
    sigterm_as_interrupt()  # a `timeout` or a CI runner's SIGTERM ends it as Ctrl-C does
    try:
        load_before = load_average()
        result = run(args)
        backend = result.get("backend") or getattr(args, "backend", None) or RUNS_ON.get(args.which, "numpy")
        result = with_machine(result, backend, load_before)
        write_json(result, args.json)
    except KeyboardInterrupt as e:  # SIGINT, or SIGTERM (sigterm_as_interrupt): what the finished parts measured
        return interrupted(f"flashrt-bench {args.which}", e, args.json)
    except BackendUnavailable as e:  # a --backend this machine lacks: one line, not a traceback
        print(f"flashrt-bench {args.which}: {e}", file=sys.stderr)
        return 1
    if getattr(args, "plot", None):
        draw_bench(args.which, result, args.plot)
    return 0


def draw_bench(which: str, result: dict, path) -> Path:
    """The figure of one `flashrt-bench` subcommand (here, not in plots: the figure modules import plots)."""
    if which == "capsules":
        from ..plots.lineage import capsule_lineage
        return capsule_lineage(result, path)
    from ..plots import figures as plots
    return {"runtime": plots.bench_runtime, "ros": plots.bench_ros, "persist": plots.bench_persist}[which](result, path)


if __name__ == "__main__":
    sys.exit(main())
