"""flashrt-replay --mode live: the bag's observations go to a real flashrt node process over DDS.

Lossless by construction: reliable QoS on 'observation' (the node's observation_reliable parameter) and
flow control (the next message is published only once the previous one's policy_step came back, never
earlier than the bag's relative timing scaled by --rate). Messages the node would reject are counted
and skipped here with the same conversion functions, so they need no answer.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import numpy as np

from .bags import JOINT_STATE, BagError, StepRecord
from .demo_mission import params_file, ros_env
from .replay import ObservationStream, RollbackChecks, _summary

ANSWER_TIMEOUT_S = 10.0


def _ros_message(msg, msgtype: str, stamp_ns: int):
    from builtin_interfaces.msg import Time
    from sensor_msgs.msg import JointState
    from std_msgs.msg import Float32MultiArray

    if msgtype == JOINT_STATE:
        out = JointState(name=list(msg.name), position=[float(v) for v in msg.position],
                         velocity=[float(v) for v in msg.velocity], effort=[float(v) for v in msg.effort])
        out.header.stamp = Time(sec=stamp_ns // 1_000_000_000, nanosec=stamp_ns % 1_000_000_000)
        out.header.frame_id = msg.header.frame_id
        return out
    return Float32MultiArray(data=np.asarray(msg.data, np.float32).tolist())


def run_live(args, src, ts, cfg) -> tuple[list[StepRecord], dict]:
    env = ros_env()
    os.environ.update({k: env[k] for k in ("ROS_DOMAIN_ID", "ROS_AUTOMATIC_DISCOVERY_RANGE", "ROS_LOG_DIR")})
    import rclpy
    from rclpy.qos import QoSProfile, ReliabilityPolicy
    from sensor_msgs.msg import JointState
    from std_msgs.msg import Float32MultiArray

    from flashrt_interfaces.msg import PolicyStep

    from ..ros.client import FlashRTClient

    obs_type = "joint_state" if src.msgtype == JOINT_STATE else "float32_array"  # what the node subscribes
    node_cmd = [sys.executable, "-m", "flashrt_ros.ros.node", "--ros-args", "--params-file",
                args.config or params_file(None), "-p", f"backend:={args.backend}",
                "-p", "observation_reliable:=true", "-p", f"observation_type:={obs_type}"]
    proc = subprocess.Popen(node_cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    rclpy.init()
    node = rclpy.create_node("flashrt_replay")
    try:
        client = FlashRTClient(node)
        got: list = []
        qos = QoSProfile(depth=1000, reliability=ReliabilityPolicy.RELIABLE)
        node.create_subscription(PolicyStep, "policy_step", got.append, qos)
        pub = node.create_publisher(JointState if obs_type == "joint_state" else Float32MultiArray,
                                    "observation", qos)
        client.wait_until_ready(60.0)
        while pub.get_subscription_count() == 0 or node.count_publishers("policy_step") == 0:
            rclpy.spin_once(node, timeout_sec=0.05)

        def send(ros_msg) -> object:
            n = len(got)
            pub.publish(ros_msg)
            deadline = time.monotonic() + ANSWER_TIMEOUT_S
            while len(got) == n:
                rclpy.spin_once(node, timeout_sec=0.01)
                if time.monotonic() > deadline:
                    raise BagError(f"live: the node did not answer an observation within {ANSWER_TIMEOUT_S} s")
            return got[-1]

        stream = ObservationStream(src, ts, cfg.obs_dim)
        records, checks = [], RollbackChecks(args.rollback_every, args.rollback_depth)
        t0, first_stamp = time.perf_counter(), None
        for stamp, stamp_ns, msg, _ in stream:
            first_stamp = stamp if first_stamp is None else first_stamp
            if args.rate > 0:
                wait = t0 + (stamp - first_stamp) / 1e9 / args.rate - time.perf_counter()
                if wait > 0:
                    time.sleep(wait)
            ros_msg = _ros_message(msg, src.msgtype, stamp_ns)
            ps = send(ros_msg)
            records.append(StepRecord(stamp_ns, ps.step, ps.capsule_id, np.asarray(ps.action, np.float32),
                                      np.asarray(ps.action_chunk, np.float32), ps.chunk_len, ps.step_latency_ms))
            checks.recent.append(ros_msg)
            if checks.due(len(records)):
                r = client.rollback(steps_back=checks.depth)
                again = [np.asarray(send(m).action, np.float32) for m in checks.recent] if r.success else []
                checks.record(r.success and all(a.tobytes() == rec.action.tobytes()
                                                for a, rec in zip(again, records[-checks.depth:])))
        return records, _summary(stream, records, checks, time.perf_counter() - t0)
    finally:
        node.destroy_node()
        rclpy.try_shutdown()
        proc.send_signal(signal.SIGINT)
        try:
            out, _ = proc.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
        if proc.returncode != 0 or "Traceback" in out:
            print(f"flashrt-replay: the node exited with {proc.returncode}:\n{out[-2000:]}", file=sys.stderr)
