"""`flashrt-bench ros`: round trips through DDS between separate processes.

A bare std_srvs/Trigger service in a tiny node gives the floor; then rollback, a 4 x 8 what-if
Replan, and observation -> policy_step latency against the flashrt node, all in one run.
"""
from __future__ import annotations

import subprocess
import sys
import threading
import time

import numpy as np

from ...runtime import PolicyConfig
from ..common import BackgroundSpin, p50_p99, progress, synthetic_trace
from ..demo.mission import params_file, ros_env
from ..step_log import StepLog

TRIGGER_NODE = """
import rclpy
from rclpy.executors import ExternalShutdownException, SingleThreadedExecutor
from std_srvs.srv import Trigger
rclpy.init()
node = rclpy.create_node("bench_trigger")
node.create_service(Trigger, "bench_trigger", lambda req, res: res)
ex = SingleThreadedExecutor()
ex.add_node(node)
try:
    ex.spin()
except (KeyboardInterrupt, ExternalShutdownException):
    pass
"""


def _timed(n: int, what: str, fn) -> list[float]:
    out = []
    for i in range(n):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1e3)
        if (i + 1) % 100 == 0:
            progress(f"{what}: {i + 1}/{n}")
    return out


def _steps_beside_replans(node_name: str, step, last_in_node, observations, branches, pinned: int,
                          block: int = 50) -> dict:
    """Observation -> policy_step latency in alternating blocks of `block` steps, the same node in the same
    run: none running, then a replan always running (another client sends them back to back)."""
    import rclpy

    from ...ros.client import FlashRTClient
    node = rclpy.create_node(node_name)
    spinner = BackgroundSpin(node, "bench_replanner_executor")
    client = FlashRTClient(node)
    go, stop, idle_now = threading.Event(), threading.Event(), threading.Event()
    idle_now.set()
    replans = []

    def replan_back_to_back() -> None:
        while not stop.is_set():
            if not go.wait(0.05):
                continue
            idle_now.clear()
            try:
                replans.append(client.replan(branches, capsule_id=pinned).result.elapsed_ms)
            finally:
                idle_now.set()

    worker = threading.Thread(target=replan_back_to_back, daemon=True)
    worker.start()
    rtt = {"idle": [], "replanning": []}
    in_node = {"idle": [], "replanning": []}
    try:
        for i, o in enumerate(observations):
            busy = (i // block) % 2 == 1
            if busy and not go.is_set():
                go.set()
                while idle_now.is_set():  # the first replan of the block has started
                    time.sleep(0.001)
            elif not busy and go.is_set():
                go.clear()
                idle_now.wait(10.0)  # the last replan of the block has ended
            key = "replanning" if busy else "idle"
            rtt[key].append(step(o))
            in_node[key].append(last_in_node())
            if (i + 1) % 100 == 0:
                progress(f"steps beside replans: {i + 1}/{len(observations)}")
    finally:
        stop.set()
        go.set()
        worker.join(30.0)
        spinner.stop()
        node.destroy_node()

    def ratio(a, b):
        return round(p50_p99(a)["p99"] / p50_p99(b)["p99"], 2)
    return {"round_trip_ms": {k: p50_p99(v) for k, v in rtt.items()},
            "in_node_ms": {k: p50_p99(v) for k, v in in_node.items()},
            "round_trip_p99_ratio": ratio(rtt["replanning"], rtt["idle"]),
            "in_node_p99_ratio": ratio(in_node["replanning"], in_node["idle"]),
            "replans": len(replans), "block_steps": block}


def run(args) -> dict:
    import os

    env = ros_env()
    os.environ.update({k: env[k] for k in ("ROS_DOMAIN_ID", "ROS_AUTOMATIC_DISCOVERY_RANGE", "ROS_LOG_DIR")})
    import rclpy
    from diagnostic_msgs.msg import DiagnosticArray
    from rclpy.qos import QoSProfile, ReliabilityPolicy
    from sensor_msgs.msg import JointState
    from std_srvs.srv import Trigger

    from flashrt_interfaces.msg import PolicyStep

    from ...ros.client import FlashRTClient
    from ...ros.io.step_link import policy_step_qos, wait_linked

    procs = [subprocess.Popen([sys.executable, "-c", TRIGGER_NODE], env=env),
             subprocess.Popen([sys.executable, "-m", "flashrt_ros.ros.main", "--ros-args", "--params-file",
                               params_file(None), "-p", f"backend:={args.backend}", "-p", "observation_reliable:=true",
                               "-p", f"thread_priority:={args.thread_priority}", "-p",
                               f"replan_nice:={args.replan_nice}"],
                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)]
    rclpy.init()
    node = rclpy.create_node("flashrt_bench_client")
    spinner = None
    try:
        client = FlashRTClient(node)
        trigger = node.create_client(Trigger, "bench_trigger")
        progress("waiting for the trigger node and the flashrt node")
        client.wait_until_ready(60.0)
        assert trigger.wait_for_service(timeout_sec=30.0)
        diag: dict = {}

        def on_diag(msg) -> None:
            for st in msg.status:
                if st.name.endswith("flashrt: runtime"):
                    diag.update({kv.key: kv.value for kv in st.values})
        node.create_subscription(DiagnosticArray, "/diagnostics", on_diag, 10)
        qos = QoSProfile(depth=100, reliability=ReliabilityPolicy.RELIABLE)
        # each policy_step's stamp and arrival on this node's clock; not the messages (~2,600 kept gave this
        # bench's garbage collector ~13,000 more objects to walk, as the demo planner's did)
        steps = StepLog(clock_ns=lambda: node.get_clock().now().nanoseconds)
        arrived = threading.Event()

        def on_step(msg) -> None:
            steps.add(msg)
            arrived.set()
        step_sub = node.create_subscription(PolicyStep, "policy_step", on_step, policy_step_qos(100))
        pub = node.create_publisher(JointState, "observation", qos)
        wait_linked(node, pub, step_sub, 60.0, alive=lambda: all(p.poll() is None for p in procs))
        # From here an executor thread takes every answer as it comes, as in a planner node (waiting by
        # spin_once added about 1 ms to a replan round trip at p50: an executor iteration per message).
        spinner = BackgroundSpin(node, "bench_executor")
        # replan from a full, wrapped window: what a long-running robot has (the shipped config's window)
        window = PolicyConfig.from_yaml(params_file(None)).kv_window
        warm = window + 64
        trace = synthetic_trace(3 * args.calls + warm + 100, 14)  # the shipped config's obs_dim
        names = [f"joint{i}" for i in range(7)]

        def step(o):
            n = len(steps)
            arrived.clear()
            msg = JointState(name=names, position=o[:7].tolist(), velocity=o[7:].tolist())
            msg.header.stamp = node.get_clock().now().to_msg()
            pub.publish(msg)
            end = time.monotonic() + 10.0
            while len(steps) == n:
                if time.monotonic() > end or not spinner.is_alive():
                    raise RuntimeError("no policy_step within 10 s of an observation (the node or this bench's "
                                       "executor thread stopped)")
                arrived.wait(0.01)
                arrived.clear()
            return steps.round_trip_ms(n)

        progress(f"warm-up: {warm} steps (fills and wraps the {window}-step KV window)")
        for o in trace[:warm]:
            step(o)
        base = client.snapshot(label="bench", pin=True).capsule
        pinned = base.id
        trig = _timed(args.calls, "trigger", lambda: client.wait_for(trigger.call_async(Trigger.Request()), 5))
        roll = _timed(args.calls, "rollback", lambda: client.rollback(capsule_id=pinned))
        branches = np.stack([trace[warm:warm + 8] + 0.05 * b for b in range(4)])
        deadline_met = []  # branch capsules evict old unpinned ones; the pinned base stays

        rep, rep_node, rep_accept = [], [], []
        for i in range(args.calls):
            t0 = time.perf_counter()
            out = client.replan(branches, capsule_id=pinned)
            rep.append((time.perf_counter() - t0) * 1e3)
            rep_node.append(out.result.elapsed_ms)
            rep_accept.append(out.accepted_ms)
            deadline_met.append(bool(out.result.deadline_met))
            if (i + 1) % 100 == 0:
                progress(f"replan 4x8: {i + 1}/{args.calls}")
        lat, in_node = [], []
        for i, o in enumerate(trace[warm:warm + args.calls]):
            lat.append(step(o))
            in_node.append(steps.last.step_latency_ms)
            if (i + 1) % 100 == 0:
                progress(f"step latency: {i + 1}/{args.calls}")
        beside = _steps_beside_replans("flashrt_bench_replanner", step, lambda: steps.last.step_latency_ms,
                                       trace[warm:warm + 2 * args.calls], branches, pinned,
                                       block=max(1, min(50, args.calls // 4)))
        out = {"calls": args.calls, "trigger_rtt": p50_p99(trig), "rollback_rtt": p50_p99(roll),
               "replan_rtt": p50_p99(rep), "replan_in_node_ms": p50_p99(rep_node),
               # issue 47.3: where the round trip goes. Per call: the goal's round trip (send to accepted), the
               # rest (execute, the result's round trip), and all that is not the node's own replan
               "replan_goal_response_ms": p50_p99(rep_accept),
               "replan_after_accept_ms": p50_p99([r - a for r, a in zip(rep, rep_accept)]),
               "replan_ros_overhead_ms": p50_p99([r - n for r, n in zip(rep, rep_node)]),
               "replan_deadline_met": f"{sum(deadline_met)}/{len(deadline_met)}",
               "replan_kv_fill": f"{min(base.step, window)}/{window}", "replan_kv_len": min(base.step, window),
               "replan_from_step": base.step,
               "step_latency": p50_p99(lat), "step_in_node_ms": p50_p99(in_node),
               "step_beside_replans": beside,
               "thread_priority": args.thread_priority, "replan_nice": args.replan_nice, "units": "ms",
               "backend": diag.get("backend", args.backend)}  # what the node's `auto` resolved to
        if getattr(args, "plot", None):  # every sample, for the CDFs (only then: 4 x calls numbers)
            out["samples_ms"] = {k: [round(x, 4) for x in v] for k, v in (
                ("trigger_rtt", trig), ("rollback_rtt", roll), ("replan_rtt", rep), ("step_latency", lat))}
        return out
    finally:
        if spinner is not None:
            spinner.stop()
        node.destroy_node()
        rclpy.try_shutdown()
        for p in procs:
            p.send_signal(2)
        for p in procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
