"""The mission on this machine, in three processes over DDS: the flashrt node (as the launch file starts
it), a 100 Hz joint-state sensor, and a planner that rolls back and re-plans every 0.5 s."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ..common import print_table, progress, stop_processes

ROOT = Path(__file__).resolve().parents[3]


def ros_env() -> dict:
    env = dict(os.environ)
    env["ROS_AUTOMATIC_DISCOVERY_RANGE"] = "LOCALHOST"  # never let discovery leave this machine
    env.setdefault("ROS_DOMAIN_ID", str(20 + os.getpid() % 80))  # as the Makefile: 20..99
    env.setdefault("ROS_LOG_DIR", tempfile.mkdtemp(prefix="flashrt-roslog."))
    env["PYTHONUNBUFFERED"] = "1"
    return env


def params_file(config: str | None) -> str:
    if config:
        return config
    local = ROOT / "config" / "flashrt.yaml"
    if local.exists():
        return str(local)
    from ament_index_python.packages import get_package_share_directory
    return str(Path(get_package_share_directory("flashrt_ros")) / "config" / "flashrt.yaml")


CPU_BURNER = "while True: pass"


def run(args) -> dict:
    env = ros_env()
    py = sys.executable
    work = Path(tempfile.mkdtemp(prefix="flashrt-demo."))
    node_cmd = [py, "-m", "flashrt_ros.ros.main", "--ros-args", "--params-file", params_file(args.config),
                "-p", f"backend:={args.backend}", "-p", f"capsule_dir:={work / 'capsules'}"]
    if args.thread_priority:  # else the params file's value
        node_cmd += ["-p", f"thread_priority:={args.thread_priority}"]
    if args.replan_nice:
        node_cmd += ["-p", f"replan_nice:={args.replan_nice}"]
    progress(f"ROS_DOMAIN_ID={env['ROS_DOMAIN_ID']}, discovery LOCALHOST, logs in {env['ROS_LOG_DIR']}")
    _warm_cpu_step(args.backend)
    t0 = time.monotonic()
    node_log = open(work / "node.log", "w")
    node = subprocess.Popen(node_cmd, env=env, stdout=node_log, stderr=subprocess.STDOUT)
    procs = [node]
    try:
        # Other work on the robot's computer: each burner keeps one core busy for the whole mission.
        procs += [subprocess.Popen([py, "-c", CPU_BURNER], stderr=subprocess.DEVNULL) for _ in range(args.cpu_load)]
        planner_json = work / "planner.json"
        planner = subprocess.Popen([py, "-m", "flashrt_ros.tools.demo.planner", "--duration", str(args.duration),
                                    "--json", str(planner_json)] + (["--timeline"] if getattr(args, "plot", None)
                                                                    else []), env=env)
        procs.append(planner)
        sensor = subprocess.Popen([py, "-m", "flashrt_ros.tools.demo.sensor_sim", "--rate", "100",
                                   "--duration", str(args.duration + 30)], env=env,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        procs.append(sensor)
        progress("node, 100 Hz sensor and planner started; the planner prints a line per round")
        rss = NodeRss(node.pid)
        deadline = time.monotonic() + args.duration + 90
        while planner.poll() is None and time.monotonic() < deadline:
            rss.sample(time.monotonic() - t0)
            time.sleep(1.0)
        rc = planner.wait(timeout=max(1.0, deadline - time.monotonic()))
        summary = json.loads(planner_json.read_text()) if planner_json.exists() else {}
    except KeyboardInterrupt as e:  # SIGINT or SIGTERM: the planner's summary of its rounds so far, the node's memory
        stop_processes(list(reversed(procs)))  # the planner writes its summary as it stops
        summary = json.loads(planner_json.read_text()) if "planner_json" in locals() and planner_json.exists() else {}
        e.partial = {**summary, "node_rss_mb": rss.summary() if "rss" in locals() else None,
                     "wall_s": round(time.monotonic() - t0, 1), "work_dir": str(work)}
        raise
    finally:
        stop_processes(list(reversed(procs)))
        node_log.close()
    node_out = (work / "node.log").read_text()
    summary["node_rss_mb"] = rss.summary()
    summary["node_exit_code"] = node.returncode
    summary["cpu_load_processes"] = args.cpu_load
    summary["thread_priority"] = args.thread_priority
    summary["replan_nice"] = args.replan_nice
    summary["node_traceback"] = "Traceback" in node_out
    summary["wall_s"] = round(time.monotonic() - t0, 1)
    summary["ok"] = bool(rc == 0 and node.returncode == 0 and not summary["node_traceback"]
                         and summary.get("steps", 0) > 0 and summary.get("deep_rollback", {}).get("ok") is not False)
    _print_summary(summary, work)
    return summary


def _warm_cpu_step(backend: str) -> None:
    """The compiled CPU step into numba's on-disk cache before the node starts: a first run compiles it for
    tens of seconds, which the node would spend inside configure while the planner waits for it."""
    from ...runtime.engine.backend import warm_cpu_step
    progress("CPU step: reading it from the on-disk cache, or compiling it (tens of seconds, first run only)")
    took = warm_cpu_step(backend)
    progress("CPU step: not used (backend numpy or cuda)" if took is None else f"CPU step: ready in {took:.1f} s")


class NodeRss:
    """The node's resident memory over the run (from /proc), to show it stays bounded."""

    SETTLE_S = 10.0  # configure allocates and prefaults the capsule budget: measure growth after that

    def __init__(self, pid: int):
        self.path = Path(f"/proc/{pid}/status")
        self.samples: list[tuple[float, float]] = []  # (seconds since start, MiB)

    def sample(self, t: float) -> None:
        try:
            for line in self.path.read_text().splitlines():
                if line.startswith("VmRSS:"):
                    self.samples.append((t, int(line.split()[1]) / 1024))
        except OSError:
            pass

    def summary(self) -> dict:
        if not self.samples:
            return {}
        settled = [m for t, m in self.samples if t >= self.SETTLE_S] or [self.samples[-1][1]]
        return {"after_start": round(settled[0], 1), "end": round(self.samples[-1][1], 1),
                "max": round(max(m for _, m in self.samples), 1),
                "growth_after_start": round(self.samples[-1][1] - settled[0], 1)}


def _print_summary(s: dict, work: Path) -> None:
    def pp(d):
        return f"{d['p50']:.2f} / {d['p99']:.2f} ms" if d and d.get("p50") is not None else "n/a"
    rows = [
        ("backend", s.get("backend", "?")),
        ("other load (busy processes)", s.get("cpu_load_processes", 0)),
        ("thread_priority (stepping thread)", s.get("thread_priority", 0)),
        ("replan_nice (replan worker)", s.get("replan_nice", 0)),
        ("steps (one per observation)", s.get("steps", 0)),
        ("rejected observations", s.get("rejected", 0)),
        ("step latency p50 / p99 (node)", pp(s.get("step_latency_ms"))),
        ("rollback p50 / p99 (node)", pp(s.get("rollback_ms"))),
        ("replan 4x8 p50 / p99 (round trip)", pp(s.get("replan_ms"))),
        ("replan deadline misses (50 ms)", s.get("deadline_misses", "?")),
        ("commits", s.get("commits", 0)),
        ("byte-exact re-plan checks", f"{s.get('byte_exact_checks', {}).get('passed', 0)} / "
                                      f"{s.get('byte_exact_checks', {}).get('run', 0)}"),
        ("deep rollback check", _deep(s.get("deep_rollback"))),
        ("node RSS after start / end / max", _rss(s.get("node_rss_mb"))),
        ("node exit", f"{s['node_exit_code']}{' (traceback!)' if s['node_traceback'] else ''}"),
        ("wall time", f"{s['wall_s']} s"),
    ]
    print_table("flashrt mission summary", rows, work, s["ok"])


def _deep(d) -> str:
    if not d:
        return "n/a"
    return f"{d['depth_s']:.1f} s back to capsule {d['anchor_capsule']}: {d['result']}"


def _rss(d) -> str:
    if not d:
        return "n/a"
    return f"{d['after_start']:.0f} / {d['end']:.0f} / {d['max']:.0f} MiB (+{d['growth_after_start']:.1f} MiB)"
