"""flashrt-demo's arm mission (the default): the MuJoCo arm, the policy node on the shipped policy and the
correction planner, three processes over DDS in one namespace.

The policy node starts first; once it subscribes to its observation, the planner (sim/mission_planner.py); once
the planner is ready, flashrt-sim with faults:=true on the held-out seeds, episodes of episode_s, the policy
reset between them. The planner stops after `duration` seconds of sim time and writes its summary, which this
returns with the processes' exits.
"""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from ..tools.common import print_table, stop_processes
from ..tools.demo.mission import ros_env
from .mission import HELD_OUT_SEED_BASE, SHIPPED_POLICY
from .ros_eval import EVAL_PARAMS, POLICY_OVERRIDES, START_TIMEOUT_S, _script

NAMESPACE = "arm"
# rollback depth for the longest correction (30 stale readings + 20 of delay) with room to spare
MISSION_PARAMS = {**EVAL_PARAMS, "capsule_budget_mb": 16.0,
                  # a node held up (a replan, the machine's load) steps each reading later rather than drop it:
                  # the planner finds a reading's capsule by counting the steps (sim/mission_planner.py)
                  f"qos_overrides./{NAMESPACE}/observation.subscription.depth": 200,
                  # no replica or standby follows this arm: a record per step on the stream was a thread's
                  # Python beside the step and the replan, and it lengthened the node's replans (docs/sim.md)
                  "capsule_stream": False}


def _params(policy: str, backend: str, work: Path) -> Path:
    params = {**POLICY_OVERRIDES, **MISSION_PARAMS, "policy_path": str(Path(policy).resolve()), "backend": backend,
              "capsule_dir": str(work / "capsules")}
    path = work / "policy_params.yaml"
    path.write_text(yaml.safe_dump({"/**": {"ros__parameters": params}}))
    return path


def _wait(node, ready, procs, what: str) -> None:
    import rclpy

    deadline = time.monotonic() + START_TIMEOUT_S
    while not ready():
        for proc in procs:
            if proc.poll() is not None:
                raise RuntimeError(f"{what}: {proc.args[0]} exited with {proc.returncode}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {START_TIMEOUT_S:.0f} s")
        rclpy.spin_once(node, timeout_sec=0.1)


def run(args) -> dict:
    import rclpy

    env = ros_env()
    os.environ["ROS_DOMAIN_ID"] = env["ROS_DOMAIN_ID"]  # this process's watcher node joins the same graph
    os.environ["ROS_AUTOMATIC_DISCOVERY_RANGE"] = "LOCALHOST"
    work = Path(tempfile.mkdtemp(prefix="flashrt-demo-arm."))
    policy = str(getattr(args, "policy", None) or SHIPPED_POLICY)
    seed = HELD_OUT_SEED_BASE if args.seed is None else args.seed
    ns = ["-r", f"__ns:=/{NAMESPACE}"]
    print(f"arm mission: ROS_DOMAIN_ID={env['ROS_DOMAIN_ID']}, discovery LOCALHOST, logs in {work}", file=sys.stderr)
    owns_rclpy = not rclpy.ok()
    if owns_rclpy:
        rclpy.init()
    watcher = rclpy.create_node("flashrt_demo_arm")
    t0 = time.monotonic()
    procs: list[subprocess.Popen] = []
    logs = {name: open(work / f"{name}.log", "w") for name in ("node", "planner", "sim")}
    planner_json = work / "planner.json"
    rc = None
    try:
        procs.append(subprocess.Popen([_script("flashrt_node"), "--ros-args", *ns, "--params-file",
                                       str(_params(policy, args.backend, work))], env=env,
                                      stdout=logs["node"], stderr=subprocess.STDOUT))
        _wait(watcher, lambda: watcher.count_subscribers(f"/{NAMESPACE}/observation") > 0, procs,
              "the policy node did not activate")
        planner_cmd = [sys.executable, "-m", "flashrt_ros.sim.mission_planner", "--namespace", f"/{NAMESPACE}",
                       "--duration", str(args.duration), "--episode-s", str(args.episode_s),
                       "--json", str(planner_json)]
        planner_cmd += (["--timeline"] if args.plot else []) + (["--no-correction"] if args.no_correction else [])
        planner = subprocess.Popen(planner_cmd, env=env, stdout=None if args.verbose else logs["planner"],
                                   stderr=subprocess.STDOUT)
        procs.append(planner)
        _wait(watcher, lambda: watcher.count_subscribers(f"/{NAMESPACE}/observation_corrected") > 0, procs,
              "the planner did not get ready")
        procs.append(subprocess.Popen([_script("flashrt-sim"), "--ros-args", *ns, "-p", f"seed:={seed}",
                                       "-p", "faults:=true", "-p", f"episode_s:={args.episode_s}",
                                       "-p", "policy_reset_service:=reset", "-p", "wait_for_subscribers:=2"],
                                      env=env,
                                      stdout=logs["sim"], stderr=subprocess.STDOUT))
        print(f"arm mission: sim on seed {seed}, {args.duration:g} s of sim time in episodes of "
              f"{args.episode_s:g} s", file=sys.stderr)
        rc = planner.wait(timeout=3 * args.duration + 120)
    except KeyboardInterrupt as e:
        stop_processes(list(reversed(procs)))  # SIGINT: the planner writes what it has
        e.partial = json.loads(planner_json.read_text()) if planner_json.exists() else {}
        raise
    finally:
        stop_processes(list(reversed(procs)))  # SIGINT: the planner writes what it has
        for log in logs.values():
            log.close()
        watcher.destroy_node()
        if owns_rclpy:
            rclpy.try_shutdown()
    summary = json.loads(planner_json.read_text()) if planner_json.exists() else {}
    node_out = (work / "node.log").read_text()
    summary.update({"mode": "ros", "policy": policy,
                    "policy_sha256": hashlib.sha256(Path(policy).read_bytes()).hexdigest(), "seed_first": seed,
                    "wall_s": round(time.monotonic() - t0, 1),
                    "planner_exit_code": rc, "node_exit_code": procs[0].returncode,
                    "node_traceback": "Traceback" in node_out, "work_dir": str(work)})
    summary["ok"] = bool(rc == 0 and procs[0].returncode == 0 and not summary["node_traceback"]
                         and summary.get("reached_duration") and summary.get("steps", 0) > 0
                         and summary.get("byte_exact_checks", {}).get("run") == summary.get("byte_exact_checks", {})
                         .get("passed"))
    print_summary(summary)
    return summary


def print_summary(s: dict) -> None:
    def pp(d):
        return f"{d['p50']:.2f} / {d['p99']:.2f} ms (max {d['max']:.2f})" if d and d.get("p50") is not None else "n/a"
    exact = s.get("byte_exact_checks", {})
    rows = [
        ("backend", s.get("backend", "?")),
        ("sim time / episodes of", f"{s.get('sim_seconds', 0)} s / {s.get('episode_s')} s from seed {s['seed_first']}"),
        ("task successes", f"{s.get('successes', 0)} / {s.get('episodes', 0)} episodes"),
        ("sensor faults (corrections arrived)", f"{s.get('corrections', 0)} {s.get('faults_by_kind', {})}"),
        ("correction replans committed", f"{s.get('replans_committed', 0)} / {s.get('corrections', 0)}"
         + ("" if s.get("correction", True) else " (--no-correction)")),
        ("replan round trip p50 / p99", pp(s.get("replan_ms"))),
        ("correction to commit p50 / p99", pp(s.get("correction_to_commit_ms"))),
        ("replans past 50 ms or cut short", s.get("deadline_misses", "?")),
        ("byte-exact checks (repeat as what-if)", f"{exact.get('passed', 0)} / {exact.get('run', 0)}"),
        ("policy steps, latency p50 / p99", f"{s.get('steps', 0)}, {pp(s.get('step_latency_ms'))}"),
        ("node exit", f"{s['node_exit_code']}{' (traceback!)' if s['node_traceback'] else ''}"),
        ("wall time", f"{s['wall_s']} s"),
    ]
    print_table("flashrt arm mission summary", rows, s["work_dir"], s["ok"], rule_pad=40)
