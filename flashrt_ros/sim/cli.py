"""flashrt-sim: the simulated Pusher arm (MuJoCo) as a ROS node, or its scripted expert offline.

    flashrt-sim [--seed S] [--expert] [--ros-args ...]       the node (ROS 2), 100 Hz on sim time (/clock)
    flashrt-sim --expert --record DIR --episodes N [--seed S] [--seconds T] [--storage mcap|sqlite3]
                [--perturb RAD] [--driver FILE] [--faults]  demonstrations as rosbag2 bags, no ROS graph (the
                                                            arm perturbed, or driven by a policy file, or the
                                                            observations faulty; the expert's targets recorded)
    flashrt-sim --expert --success-rate [--episodes 100]    the expert on held-out seeds (none recorded)
    flashrt-sim --policy FILE --success-rate [--episodes 100] [--ros]
                                                            a policy file on the same seeds: offline (a Session
                                                            in the world loop) or, with --ros, through ROS (a
                                                            flashrt node and flashrt-sim per episode)
"""
from __future__ import annotations

import argparse
import sys


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="flashrt-sim", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--expert", action="store_true", help="the scripted expert drives the arm")
    ap.add_argument("--record", metavar="DIR", help="with --expert: write one bag per episode to DIR, offline")
    ap.add_argument("--success-rate", action="store_true",
                    help="with --expert: its success rate over --episodes held-out episodes")
    ap.add_argument("--policy", metavar="FILE", help="with --success-rate: a policy file (policy_path) drives the arm")
    ap.add_argument("--ros", action="store_true",
                    help="with --policy: each episode through ROS (a flashrt node and flashrt-sim), in real time")
    ap.add_argument("--backend", choices=("cpu", "numpy"), default="cpu", help="offline --policy: the Session's")
    ap.add_argument("--episodes", type=int, default=None, help="episodes to record or evaluate (10 / 100)")
    ap.add_argument("--seed", type=int, default=None, help="seed of the first episode (default 0)")
    ap.add_argument("--seconds", type=float, default=10.0, help="longest episode, in sim seconds (default 10)")
    ap.add_argument("--perturb", type=float, default=0.0, metavar="RAD",
                    help="with --record: the arm executes the expert's targets plus a drifting offset of this std; "
                         "the bags keep the expert's targets (default 0)")
    ap.add_argument("--driver", metavar="FILE", help="with --record: this policy file drives the arm and the bags "
                    "keep the expert's answers (DAgger)")
    ap.add_argument("--faults", action="store_true", help="with --record: the bags' observations carry the "
                    "episode's seeded sensor faults (sim/faults.py); the expert answers the true state")
    ap.add_argument("--storage", choices=("mcap", "sqlite3"), default="mcap", help="bag storage (default mcap)")
    ap.add_argument("--headless", action="store_true", help="no viewer (the only mode: accepted for scripts)")
    return ap


def _policy_success_rate(args) -> int:
    from .record import HELD_OUT_SEED_BASE
    n = args.episodes or 100
    first = HELD_OUT_SEED_BASE + (args.seed or 0)
    seeds = range(first, first + n)
    if args.ros:
        from .ros_eval import ros_success
        results = ros_success(args.policy, seeds, args.seconds, on_episode=lambda r: print(
            f"seed {r.seed}: {'success' if r.success else 'failure'} at {r.sim_seconds:.2f} s sim time "
            f"({r.policy_steps} policy steps)", flush=True))
        how = "through ROS"
    else:
        from .evaluate import evaluate_policy
        try:
            results = evaluate_policy(args.policy, seeds, args.seconds, args.backend)
        except (ValueError, OSError) as e:  # a WeightsError is a ValueError
            print(f"flashrt-sim: {e}", file=sys.stderr)
            return 2
        how = "offline"
    ok = sum(r.success for r in results)
    print(f"policy success rate: {ok / n:.2f} ({ok}/{n}) over held-out episodes from seed {first} ({how})")
    return 0


def main(argv=None) -> int:
    """Exit 0 on success, 2 on bad arguments or an existing bag."""
    argv = list(sys.argv[1:] if argv is None else argv)
    ros_args = argv[argv.index("--ros-args"):] if "--ros-args" in argv else []
    args = _parser().parse_args(argv[:len(argv) - len(ros_args)])
    if args.record and not args.expert:
        print("flashrt-sim: --record: recordings need --expert (its demonstrations)", file=sys.stderr)
        return 2
    if (args.perturb or args.driver or args.faults) and not args.record:
        print("flashrt-sim: --perturb, --driver and --faults go with --record", file=sys.stderr)
        return 2
    if args.success_rate and args.expert == bool(args.policy):
        print("flashrt-sim: --success-rate needs one of --expert and --policy FILE", file=sys.stderr)
        return 2
    if (args.policy or args.ros) and not args.success_rate:
        print("flashrt-sim: --policy and --ros go with --success-rate", file=sys.stderr)
        return 2
    if args.record:
        from .evaluate import policy_session
        from .record import COMMAND_TOPIC, OBS_TOPIC, record_episodes
        try:
            done = record_episodes(args.record, args.episodes or 10, args.seed or 0, args.seconds, args.storage,
                                   perturb=args.perturb, faults=args.faults,
                                   driver=policy_session(args.driver, args.backend) if args.driver else None)
        except (ValueError, FileExistsError) as e:
            print(f"flashrt-sim: {e}", file=sys.stderr)
            return 2
        ok = sum(r.success for r in done)
        print(f"wrote {len(done)} bags to {args.record} ({ok} successful; {OBS_TOPIC} obs_dim 21, {COMMAND_TOPIC})")
        return 0
    if args.success_rate and args.policy:
        return _policy_success_rate(args)
    if args.success_rate:
        from .expert import success_rate
        from .record import HELD_OUT_SEED_BASE
        n = args.episodes or 100
        first = HELD_OUT_SEED_BASE + (args.seed or 0)
        rate = success_rate(range(first, first + n), args.seconds)
        print(f"expert success rate: {rate:.2f} over {n} held-out episodes")
        return 0
    from .node import main as node_main
    # only the flags given: a launch file's parameters (after --ros-args) must not be overridden by defaults
    params = (["-p", f"seed:={args.seed}"] if args.seed is not None else []) + (["-p", "expert:=true"] if args.expert
                                                                                 else [])
    return node_main(["flashrt-sim", "--ros-args", *params, *ros_args[1:]])


if __name__ == "__main__":
    sys.exit(main())
