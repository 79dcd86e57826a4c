"""The stream bench's robot (flashrt-bench stream): its nodes' processes, and this process as the robot's
sensor and listener. Used by the stream part (stream.py) and the failover part (stream_failover.py)."""
from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from ...ros.io.convert import stamp_to_ns
from ..demo.mission import params_file

RATE_HZ = 100.0


def start_node(env, log_dir: Path, ns: str, backend: str, **params) -> subprocess.Popen:
    args = [sys.executable, "-m", "flashrt_ros.ros.main", "--ros-args", "-r", f"__ns:={ns}", "--params-file",
            params_file(None), "-p", f"backend:={backend}", "-p", "observation_reliable:=true"]
    for k, v in params.items():
        args += ["-p", f"{k}:={v}"]
    log = open(log_dir / f"{ns.strip('/')}.log", "w")
    return subprocess.Popen(args, env=env, stdout=log, stderr=subprocess.STDOUT)


class Robot:
    """This bench's rclpy node as the robot's sensor (JointState at 100 Hz, stamped when sent) and as a
    listener of policy_step, /diagnostics and flashrt_leader."""

    def __init__(self, node, ns: str):
        from diagnostic_msgs.msg import DiagnosticArray
        from rclpy.qos import QoSProfile, ReliabilityPolicy
        from sensor_msgs.msg import JointState

        from flashrt_interfaces.msg import Leader, PolicyStep

        from ...ros.group.leader import leader_qos
        from ...ros.io.step_link import policy_step_qos
        self.node, self.ns, self.JointState = node, ns, JointState
        self.steps: list = []  # (receipt monotonic time, PolicyStep)
        self.diag: dict = {}  # node name -> [values of each status]
        self.leaders: list = []  # (receipt time, Leader)
        self.sent: list = []  # the stamp (ns) of each observation published, in order
        def stamped(into):
            return lambda m: into.append((time.monotonic(), m))
        self.subs = [
            node.create_subscription(PolicyStep, f"{ns}/policy_step", stamped(self.steps), policy_step_qos(1000)),
            node.create_subscription(DiagnosticArray, "/diagnostics", self._on_diag, 50),
            node.create_subscription(Leader, f"{ns}/flashrt_leader", stamped(self.leaders), leader_qos(16))]
        self.pub = node.create_publisher(JointState, f"{ns}/observation",
                                         QoSProfile(depth=100, reliability=ReliabilityPolicy.RELIABLE))
        self.names = [f"joint{i}" for i in range(7)]

    def _on_diag(self, msg) -> None:
        for st in msg.status:
            self.diag.setdefault(st.name.split(":")[0], []).append({kv.key: kv.value for kv in st.values})

    def spin(self, seconds: float) -> None:
        import rclpy
        end = time.monotonic() + seconds
        while True:
            rclpy.spin_once(self.node, timeout_sec=max(0.0, min(0.005, end - time.monotonic())))
            if time.monotonic() >= end:
                return

    def run(self, obs, on_tick=None) -> None:
        """Publish obs at 100 Hz (each stamped now), spinning between; on_tick(i) after each."""
        t_next = time.monotonic()
        for i, o in enumerate(obs):
            msg = self.JointState(name=self.names, position=o[:7].tolist(), velocity=o[7:].tolist())
            msg.header.stamp = self.node.get_clock().now().to_msg()
            self.pub.publish(msg)
            self.sent.append(stamp_to_ns(msg.header.stamp))
            if on_tick is not None:
                on_tick(i)
            t_next += 1.0 / RATE_HZ
            self.spin(max(0.0, t_next - time.monotonic()))

    def step_each(self, obs, subscribers: int, timeout: float = 30.0) -> None:
        """Once ``subscribers`` nodes subscribe, publish each of obs after the previous one was stepped: a node
        that just activated (its first steps slow) drops nothing from its history. TimeoutError otherwise."""
        end = time.monotonic() + timeout
        while self.pub.get_subscription_count() < subscribers:
            if time.monotonic() > end:
                raise TimeoutError(f"{self.ns}/observation: {self.pub.get_subscription_count()} of {subscribers} "
                                   f"subscribers after {timeout:.0f} s")
            self.spin(0.05)
        for i, o in enumerate(obs):
            n = len(self.steps)
            self.run([o])
            while len(self.steps) == n:
                if time.monotonic() > end:
                    raise TimeoutError(f"{self.ns}: observation {i + 1} of {len(obs)} never stepped")
                self.spin(0.01)

    def wait_steps(self, n: int, timeout: float = 10.0) -> None:
        end = time.monotonic() + timeout
        while len(self.steps) < n and time.monotonic() < end:
            self.spin(0.01)


def held_ids(client, timeout_s: float = 5.0) -> set[int]:
    return {c.id for c in client.list_capsules(timeout_s=timeout_s).capsules}
