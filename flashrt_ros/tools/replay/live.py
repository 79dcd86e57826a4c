"""flashrt-replay --mode live: the bag's observations go to a real flashrt node process over DDS.

Lossless by construction: reliable QoS on 'observation' (the node's observation_reliable parameter) and
flow control (the next message is published only once the previous one's policy_step came back, never
earlier than the bag's relative timing scaled by --rate, with every gap capped at --max-gap). Messages
the node would reject are counted and skipped here with the same conversion function and joint_names,
so they need no answer. The node dies with this process (PR_SET_PDEATHSIG on Linux) and is stopped in
every exit path.
"""
from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from ..common import progress
from ..demo.mission import ros_env
from .bags import JOINT_STATE, StepRecord
from .stream import STOP, NodeFailed, ObservationStream, RollbackChecks, observation_type

ANSWER_TIMEOUT_S = 10.0
READY_TIMEOUT_S = 60.0
READY_SLICE_S = 1.0  # how long a SIGTERM can wait while the node starts
PACE_SLICE_S = 0.02  # how long a SIGTERM can wait while pacing
PROGRESS_EVERY = 500
STREAM_TAIL_S = 2.0  # --out: how long the capsule records of the last steps are waited for
PR_SET_PDEATHSIG = 1


def _die_with_parent(parent_pid: int):
    """A preexec_fn: the kernel sends SIGTERM to the node when this process dies, even by SIGKILL."""
    def preexec():
        try:
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        except (OSError, AttributeError):  # not Linux: the finally below still stops the node
            return
        if os.getppid() != parent_pid:  # the parent died before prctl took effect
            os.kill(os.getpid(), signal.SIGTERM)
    return preexec


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


class Pacer:
    """Bag timing scaled by --rate, each gap between two messages capped at --max-gap seconds (a bag with
    a one-day hole replays in seconds); out-of-order stamps wait nothing."""

    def __init__(self, rate: float, max_gap_s: float):
        self.rate, self.max_gap_ns = rate, int(max_gap_s * 1e9)
        self.t0 = self.prev = None
        self.bag_elapsed_ns = 0

    def wait(self, bag_stamp_ns: int) -> None:
        if self.prev is None:
            self.t0 = time.perf_counter()
        else:
            self.bag_elapsed_ns += min(max(bag_stamp_ns - self.prev, 0), self.max_gap_ns)
        self.prev = bag_stamp_ns
        if self.rate > 0:
            due = self.t0 + self.bag_elapsed_ns / 1e9 / self.rate
            while (delay := due - time.perf_counter()) > 0:
                time.sleep(min(delay, PACE_SLICE_S))
                STOP.check()


def _init_rclpy():
    """rclpy without its own signal handlers: SIGINT and SIGTERM stay with flashrt-replay, which stops the
    node and exits with 130 / 143."""
    import rclpy

    try:
        from rclpy.signals import SignalHandlerOptions
        rclpy.init(signal_handler_options=SignalHandlerOptions.NO)
    except (ImportError, TypeError):  # an rclpy without the option
        rclpy.init()


def run_live(args, src, ts, cfg, sink) -> dict:
    """All of it with signals deferred (STOP): SIGINT / SIGTERM end it at the next safe point, the node
    is stopped, and the signal is raised after that."""
    with STOP.deferred():
        return _run_live(args, src, ts, cfg, sink)


def _run_live(args, src, ts, cfg, sink) -> dict:
    env = ros_env()
    os.environ.update({k: env[k] for k in ("ROS_DOMAIN_ID", "ROS_AUTOMATIC_DISCOVERY_RANGE", "ROS_LOG_DIR")})
    obs_type = observation_type(src.msgtype)  # what the node subscribes to
    node_cmd = [sys.executable, "-m", "flashrt_ros.ros.main", "--ros-args", "--params-file", args.config,
                "-p", f"backend:={args.backend}", "-p", "observation_reliable:=true",
                "-p", f"observation_type:={obs_type}"]
    log_path = Path(env["ROS_LOG_DIR"]) / f"flashrt_replay_node.{os.getpid()}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "w") as log:  # a file, not a pipe: a chatty node can never block on a full pipe
        proc = subprocess.Popen(node_cmd, env=env, stdout=log, stderr=subprocess.STDOUT,
                                preexec_fn=_die_with_parent(os.getpid()) if sys.platform.startswith("linux") else None)
    progress(f"live: node pid {proc.pid}, ROS_DOMAIN_ID={env['ROS_DOMAIN_ID']}, node log {log_path}")
    node = None
    try:
        _init_rclpy()
        import rclpy
        node = rclpy.create_node("flashrt_replay")
        return _stream(args, src, ts, cfg, sink, node, proc)
    finally:
        if node is not None:
            node.destroy_node()
        import rclpy
        rclpy.try_shutdown()
        _stop(proc, log_path)


def _stream(args, src, ts, cfg, sink, node, proc) -> dict:
    import rclpy
    from rclpy.qos import QoSProfile, ReliabilityPolicy
    from sensor_msgs.msg import JointState
    from std_msgs.msg import Float32MultiArray

    from flashrt_interfaces.msg import PolicyStep

    from ...ros.client import FlashRTClient
    from ...ros.io.fence import EpochFence
    from ...ros.io.step_link import policy_step_qos, wait_linked

    client = FlashRTClient(node)
    got: list = []
    qos = QoSProfile(depth=1000, reliability=ReliabilityPolicy.RELIABLE)
    fence = EpochFence()  # a step of an older leader than one already seen is dropped (issue 44.2)
    step_sub = node.create_subscription(PolicyStep, "policy_step",
                                        lambda m: got.append(m) if fence.admit(m.epoch) else None,
                                        policy_step_qos(1000))
    records = _record_stream(node, sink.out) if sink.out is not None else None
    pub = node.create_publisher(JointState if src.msgtype == JOINT_STATE else Float32MultiArray, "observation", qos)
    _wait_ready(client, proc)
    try:
        wait_linked(node, pub, step_sub, READY_TIMEOUT_S, alive=lambda: proc.poll() is None and STOP.signum is None)
    except Exception as e:  # noqa: BLE001 - TimeoutError, or RuntimeError once alive() is false
        STOP.check()
        state = "exited" if proc.poll() is not None else f"was not ready within {READY_TIMEOUT_S} s"
        raise NodeFailed(f"live: the node {state} ({e})") from None
    if records is not None:  # its first record (a keyframe) must not go out before the recorder matched it
        end = time.monotonic() + READY_TIMEOUT_S
        while node.count_publishers("/flashrt/capsule_stream") == 0 and time.monotonic() < end:
            rclpy.spin_once(node, timeout_sec=0.05)
            STOP.check()
        rclpy.spin_once(node, timeout_sec=0.2)
    progress("live: node ready, streaming")

    def send(ros_msg):
        got.clear()  # one message in flight: the answer is the next policy_step
        pub.publish(ros_msg)
        deadline = time.monotonic() + ANSWER_TIMEOUT_S
        while not got:
            rclpy.spin_once(node, timeout_sec=0.01)
            STOP.check()  # here, in plain Python: never from inside rclpy
            if proc.poll() is not None:
                raise NodeFailed(f"live: the node exited with {proc.returncode} during the replay")
            if time.monotonic() > deadline:
                raise NodeFailed(f"live: the node did not answer an observation within {ANSWER_TIMEOUT_S} s")
        return got.pop()

    stream = ObservationStream(src, ts, cfg, args.start_offset)
    checks = RollbackChecks(args.rollback_every, args.rollback_depth)
    pacer = Pacer(args.rate, args.max_gap)
    t0 = time.perf_counter()
    for stamp, stamp_ns, _, msg, _ in stream:
        pacer.wait(stamp)
        ros_msg = _ros_message(msg, src.msgtype, stamp_ns)
        ps = send(ros_msg)
        action = np.asarray(ps.action, np.float32)
        sink.add(StepRecord(stamp_ns, ps.step, ps.capsule_id, action, np.asarray(ps.action_chunk, np.float32),
                            ps.chunk_len, ps.step_latency_ms, ps.header.frame_id))
        checks.push(ros_msg, action)
        if checks.due(sink.steps):
            r = client.rollback(steps_back=checks.depth)
            STOP.check()
            checks.record([np.asarray(send(m).action, np.float32) for m in checks.recent_inputs]
                          if r.success else [])
        if stream.messages % PROGRESS_EVERY == 0:
            progress(f"live: {stream.messages} messages, {sink.steps} steps")
    if records is not None:  # the records of the last steps are still on their way
        end = time.monotonic() + STREAM_TAIL_S
        while records[0] < sink.steps and time.monotonic() < end:
            rclpy.spin_once(node, timeout_sec=0.01)
    return sink.summary(stream, checks, time.perf_counter() - t0)


def _record_stream(node, out) -> list:
    """The node's capsule stream written into the output bag as it arrives; returns [newest step recorded]."""
    from rclpy.serialization import serialize_message

    from flashrt_interfaces.msg import CapsuleRecord

    from ...ros.group.stream import stream_qos
    newest = [0]

    def on_record(msg) -> None:
        out.write_capsule_record_cdr(msg.stamp.sec * 1_000_000_000 + msg.stamp.nanosec, serialize_message(msg))
        newest[0] = max(newest[0], msg.step)
    node.create_subscription(CapsuleRecord, "flashrt/capsule_stream", on_record, stream_qos())
    return newest


def _wait_ready(client, proc) -> None:
    """client.wait_until_ready in slices, so a signal or a node that exits ends the wait early."""
    from ...ros.client import FlashRTTimeout

    deadline = time.monotonic() + READY_TIMEOUT_S
    while True:
        try:
            client.wait_until_ready(READY_SLICE_S)
            return
        except FlashRTTimeout as e:
            STOP.check()
            if proc.poll() is not None:
                raise NodeFailed(f"live: the node exited with {proc.returncode} before it was ready ({e})") from None
            if time.monotonic() > deadline:
                raise NodeFailed(f"live: the node was not ready within {READY_TIMEOUT_S} s ({e})") from None


def _stop(proc, log_path: Path) -> None:
    """SIGINT, then SIGKILL after 15 s; the node's output is shown when it did not end cleanly."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    out = log_path.read_text(errors="replace") if log_path.exists() else ""
    if proc.returncode not in (0, -signal.SIGINT) or "Traceback" in out:
        print(f"flashrt-replay: the node exited with {proc.returncode}:\n{out[-2000:]}", file=sys.stderr)
