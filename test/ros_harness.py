"""Real ROS 2 processes for tests: the flashrt node in a subprocess, a planner/sensor node in the test.

Every test gets its own ROS_DOMAIN_ID (domain_coordinator), ROS_AUTOMATIC_DISCOVERY_RANGE=LOCALHOST and
a private ROS_LOG_DIR, so runs never talk to each other or leave this machine.
"""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from flashrt_ros.tools.common import stop_processes

ROOT = Path(__file__).resolve().parents[1]
PARAMS = ROOT / "config" / "flashrt.yaml"
# capsule_budget_mb: with 48 records the KV log takes the rest of the budget, and a node that faults in the
# default 512 MB spent 2-6 s of each start on this VM's first touch (fresh memory comes back from the host)
FAST = {"kv_window": 256, "capsule_capacity": 48, "capsule_budget_mb": 64.0, "observation_reliable": True,
        "backend": "numpy"}


def ros_env(domain_id: int, log_dir: Path) -> dict:
    env = dict(os.environ)
    env.update(ROS_DOMAIN_ID=str(domain_id), ROS_AUTOMATIC_DISCOVERY_RANGE="LOCALHOST", ROS_LOG_DIR=str(log_dir),
               PYTHONUNBUFFERED="1", RCUTILS_LOGGING_BUFFERED_STREAM="0")
    return env


def param_args(params: dict) -> list[str]:
    out = []
    for k, v in params.items():
        if isinstance(v, bool):
            v = str(v).lower()
        elif isinstance(v, (list, tuple)):
            v = "[" + ",".join(str(x) for x in v) + "]"
        out += ["-p", f"{k}:={v}"]
    return out


class NodeProcess:
    """`python -m flashrt_ros.ros.main` with the launch file's arguments (params file + namespace)."""

    def __init__(self, env: dict, log_path: Path, namespace: str = "/test", extra_args: tuple = (),
                 params_file: Path | str | None = PARAMS, preexec_fn=None, **params):
        self.namespace = namespace
        self.log_path = log_path
        files = ["--params-file", str(params_file)] if params_file else []
        cmd = [sys.executable, "-m", "flashrt_ros.ros.main", "--ros-args", "-r", f"__ns:={namespace}",
               *files, *param_args({**FAST, **params}), *extra_args]
        self.log = open(log_path, "w")
        self.proc = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=self.log, stderr=subprocess.STDOUT,
                                     preexec_fn=preexec_fn)

    def output(self) -> str:
        if not self.log.closed:
            self.log.flush()
        return self.log_path.read_text()

    def stop(self, timeout: float = 15.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.send_signal(signal.SIGUSR1)  # the node prints every thread's stack: where it hangs
                time.sleep(1.0)
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        return self.proc.returncode


def terminate_all(procs, timeout: float = 10.0) -> None:
    """SIGTERM to each process, then SIGKILL to any still running after ``timeout``."""
    stop_processes(procs, timeout, sig=signal.SIGTERM)


def primary_and(role: str, ros_domain, tmp_path: Path, ns: str, primary_params: dict | None = None, **params):
    """A primary in /robot1 (keyframes every second) and a node of ``role`` in ``ns`` following it, each in its
    own process; a Planner on /robot1 and a FlashRTClient on ``ns``, both ready. Returns
    (primary, other, planner, client); the caller stops them."""
    from flashrt_ros.ros.client import FlashRTClient
    primary = NodeProcess(ros_domain, tmp_path / "primary.log", namespace="/robot1",
                          capsule_dir=str(tmp_path / "primary_caps"),
                          **{"stream_keyframe_s": 1.0, **(primary_params or {})})
    other = NodeProcess(ros_domain, tmp_path / f"{role}.log", namespace=ns, role=role,
                        capsule_dir=str(tmp_path / f"{role}_caps"), **{"primary": "/robot1", **params})
    planner = Planner(namespace="/robot1")
    try:
        client = FlashRTClient(planner.node, ns)
        planner.wait_ready(subscribers=2 if role == "standby" else 1)
        client.wait_until_ready(30.0)
    except BaseException:  # nodes that never got ready must not run on into the next tests
        planner.close()
        primary.stop(), other.stop()
        raise
    return primary, other, planner, client


def export_content(path: Path) -> tuple:
    """A capsule export's metadata (sorted: safetensors writes its map in a per-process hash order) and bytes."""
    import json
    import struct
    blob = path.read_bytes()
    n = struct.unpack("<Q", blob[:8])[0]
    header = json.loads(blob[8:8 + n])
    return sorted(header.pop("__metadata__").items()), sorted(header.items()), blob[8 + n:]


def env_without_module(env: dict, shim_dir: Path, module: str) -> dict:
    """The node's environment with `module` unimportable (a sitecustomize on PYTHONPATH blocks it), as on
    a machine where that optional dependency is not installed."""
    shim_dir.mkdir(parents=True, exist_ok=True)
    (shim_dir / "sitecustomize.py").write_text(f"import sys\nsys.modules[{module!r}] = None  # import fails\n")
    out = dict(env)
    out["PYTHONPATH"] = os.pathsep.join(p for p in (str(shim_dir), env.get("PYTHONPATH", "")) if p)
    return out


def spin_until(node, future, timeout: float = 10.0):
    """Spin the test's node until `future` is done; its result (TimeoutError otherwise)."""
    import rclpy
    end = time.monotonic() + timeout
    while not future.done() and time.monotonic() < end:
        rclpy.spin_once(node, timeout_sec=0.01)
    if not future.done():
        raise TimeoutError(f"no answer within {timeout} s ({dds_ids()})")
    return future.result()


TEST_DOMAINS = 19  # tests take ROS_DOMAIN_IDs 1..19; the Makefile, .ci/run and the demo take 20 + pid % 80
# Set by conftest before each test: whether it carries the `graph` marker, which schedules it (pytest.ini).
GRAPH_TEST = True


class _NextDomain:
    """The next test's domain: another than the last test's (domain_coordinator's default selector starts at 1
    on every call, so a run's tests all shared domain 1 with the dead shared-memory ports of every earlier
    test's kills). Each xdist worker starts its round elsewhere, so two workers seldom take turns on one domain."""

    def __init__(self, worker: int = 0):
        self.value = worker * 7

    def __call__(self) -> int:
        self.value += 1
        return (self.value - 1) % TEST_DOMAINS + 1


_NEXT_DOMAIN = _NextDomain(int(os.environ.get("PYTEST_XDIST_WORKER", "gw0")[2:] or 0))


@contextlib.contextmanager
def fresh_domain():
    """A ROS_DOMAIN_ID no other test process holds, another than the previous test's, without the ports killed
    processes left in it. Reserved as domain_coordinator reserves one (a bound TCP port), but here: its
    domain_id() catches OSError around its yield, so a TimeoutError in the body came out as "generator didn't
    stop after throw()"."""
    import socket

    from domain_coordinator.impl import PORT_BASE
    if not GRAPH_TEST:
        raise RuntimeError("a test that takes a ROS domain carries the `graph` marker (or uses a graph fixture): "
                           "make test schedules the tests by their markers (pytest.ini)")
    for _ in range(TEST_DOMAINS):
        did = _NEXT_DOMAIN()
        reservation = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            reservation.bind(("", PORT_BASE + did))
        except OSError:
            reservation.close()
            continue  # another test run holds it
        try:
            forget_dead_ports(did)
            yield did
        finally:
            reservation.close()
        return
    raise RuntimeError(f"every test ROS domain (1..{TEST_DOMAINS}) is held by other test runs")


def forget_dead_ports(domain: int) -> list[int]:
    """Remove the shared-memory ports (segment, lock file, mutex) that killed processes left in ``domain``; the
    ids they had. Only between tests: a later test on the same domain would otherwise start among an earlier
    one's dead listeners (Fast DDS 2.14 has open bugs there, eProsima/Fast-DDS#5053, #5469), which no robot's
    fresh boot has; the node's own handling of them is tested on purpose (test_dead_participants, the kills)."""
    import fcntl

    from flashrt_ros.ros.platform.dead_participants import MAX_IDS, MIN_AGE_S, PORT_PREFIXES, SHM_DIR, shm_port
    dead = []
    for pid in range(MAX_IDS):
        port = shm_port(domain, pid)
        for prefix in PORT_PREFIXES:
            lock = SHM_DIR / f"{prefix}_port{port}_el"
            try:
                if time.time() - lock.stat().st_mtime < MIN_AGE_S:
                    continue  # a participant starting now: it creates the file an instant before it locks it
                with open(lock, "rb") as held:
                    fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)  # fails while its listener lives
                    # the mutex without taking it: no process of an earlier test (TEST_DOMAINS tests ago) sends here
                    for name in (f"{prefix}_port{port}", f"sem.{prefix}_port{port}_mutex", lock.name):
                        (SHM_DIR / name).unlink(missing_ok=True)
            except OSError:
                continue
            dead.append(pid)
    return sorted(set(dead))


def dds_ids() -> str:
    """This process's DDS participant ids and the domain's dead ones: what a missing answer is read with."""
    from flashrt_ros.ros.platform.dead_participants import dead_participant_ids, own_participant_ids
    domain = int(os.environ.get("ROS_DOMAIN_ID") or 0)
    return (f"domain {domain}: the test process has ids {own_participant_ids(domain)}, "
            f"dead ids {dead_participant_ids(domain)}")


_CLIENTS: dict = {}


def call(planner, srv_type, name: str, timeout: float = 10.0, **fields):
    """Call `namespace/name` with a plain rclpy client (independent of FlashRTClient's API)."""
    key = (id(planner.node), name)
    cli = _CLIENTS.get(key)
    if cli is None:
        full = name if name.startswith("/") else f"{planner.namespace}/{name}"
        cli = _CLIENTS[key] = planner.node.create_client(srv_type, full)
        if not cli.wait_for_service(timeout_sec=timeout):
            raise TimeoutError(f"service {full} not available")
    return spin_until(planner.node, cli.call_async(srv_type.Request(**fields)), timeout)


def stamp_ns(msg) -> int:
    """A message's header stamp in nanoseconds."""
    from flashrt_ros.ros.io.convert import stamp_to_ns
    return stamp_to_ns(msg.header.stamp)


def joint_state(obs: np.ndarray, stamp_ns: int, n_joints: int = 7):
    from builtin_interfaces.msg import Time
    from sensor_msgs.msg import JointState
    msg = JointState()
    msg.header.stamp = Time(sec=stamp_ns // 10**9, nanosec=stamp_ns % 10**9)
    msg.name = [f"joint{i}" for i in range(n_joints)]
    msg.position = [float(v) for v in obs[:n_joints]]
    msg.velocity = [float(v) for v in obs[n_joints:2 * n_joints]]
    return msg


class Planner:
    """The test's own rclpy node: publishes observations, records policy_step, calls services."""

    def __init__(self, namespace: str = "/test", name: str = "test_planner"):
        import rclpy
        from rclpy.qos import QoSProfile, ReliabilityPolicy
        from sensor_msgs.msg import JointState

        from flashrt_interfaces.msg import PolicyStep
        from flashrt_ros.ros.client import FlashRTClient
        from flashrt_ros.ros.io.step_link import policy_step_qos
        self.rclpy = rclpy
        self.namespace = namespace
        self.node = rclpy.create_node(name)
        self.client = FlashRTClient(self.node, namespace)
        self.steps: list = []
        qos = QoSProfile(depth=1000, reliability=ReliabilityPolicy.RELIABLE)
        # transient-local: a step whose answer raced the DDS match still arrives (see step_link)
        self.step_sub = self.node.create_subscription(PolicyStep, f"{namespace}/policy_step", self.steps.append,
                                                      policy_step_qos(1000))
        self.pub = self.node.create_publisher(JointState, f"{namespace}/observation", qos)
        self.stamp = 1_000_000_000

    def wait_ready(self, timeout: float = 30.0, subscribers: int = 1) -> None:
        """subscribers: the nodes that read the observations (2 with a standby)."""
        from flashrt_ros.ros.io.step_link import wait_linked
        self.client.wait_until_ready(timeout)
        wait_linked(self.node, self.pub, self.step_sub, timeout, subscribers=subscribers)

    def spin(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            self.rclpy.spin_once(self.node, timeout_sec=min(0.01, max(0.0, end - time.monotonic())))

    def publish(self, msg) -> None:
        self.pub.publish(msg)

    def publish_and_wait(self, msg, timeout: float = 10.0):
        """Publish one observation and return the policy_step it produced (asserts one came)."""
        n = len(self.steps)
        self.publish(msg)
        end = time.monotonic() + timeout
        while len(self.steps) == n and time.monotonic() < end:
            self.spin(0.01)
        assert len(self.steps) > n, "no policy_step"
        return self.steps[-1]

    def spin_until(self, done, timeout_s: float = 10.0) -> bool:
        """Spin until done() or timeout_s; whether done() (the test's asserts say what was missing)."""
        end = time.monotonic() + timeout_s
        while not done() and time.monotonic() < end:
            self.spin(0.05)
        return bool(done())

    def step(self, obs: np.ndarray, timeout: float = 10.0, dead=None, grace: float = 0.3):
        """Publish one observation and wait for its policy_step (flow control: nothing is overwritten).
        dead(): the node is known dead, so the wait ends ``grace`` seconds later (an answer sent before it
        died still arrives in that time) instead of at the timeout. TimeoutError either way."""
        n = len(self.steps)
        self.stamp += 10_000_000
        self.publish(joint_state(obs, self.stamp))
        deadline = time.monotonic() + timeout
        while len(self.steps) == n:
            self.rclpy.spin_once(self.node, timeout_sec=0.01)
            now = time.monotonic()
            if dead is not None and dead():
                deadline = min(deadline, now + grace)
            if now > deadline:
                raise TimeoutError("no policy_step for the observation")
        return self.steps[-1]

    def run(self, obs: np.ndarray) -> np.ndarray:
        return np.stack([np.asarray(self.step(o).action, np.float32) for o in obs])

    def close(self) -> None:
        for key in [k for k in _CLIENTS if k[0] == id(self.node)]:
            del _CLIENTS[key]
        self.node.destroy_node()


def reference_session(**params):
    """A Session in the test process with the node's configuration (params file + FAST + params): on the
    NumPy backend it produces the node's action bytes for the same observations."""
    import dataclasses

    import yaml

    from flashrt_ros.runtime import PolicyConfig, Session
    fields = {f.name for f in dataclasses.fields(PolicyConfig)}
    values = yaml.safe_load(PARAMS.read_text())["/**"]["ros__parameters"]
    values.update({**FAST, **params})
    return Session(PolicyConfig(**{k: v for k, v in values.items() if k in fields}), "numpy")


class Diagnostics:
    def __init__(self, planner):
        from diagnostic_msgs.msg import DiagnosticArray
        self.planner, self.msgs = planner, []
        planner.node.create_subscription(DiagnosticArray, "/diagnostics", self.msgs.append, 10)

    def until(self, pred, timeout: float = 10.0):
        """The first status from now on that satisfies pred(values): a message published before a
        transition or a step may still arrive after it (topics are not ordered across each other)."""
        n, values = len(self.msgs), None
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            for msg in self.msgs[n:]:
                (status,) = msg.status
                values = {kv.key: kv.value for kv in status.values}
                if pred(values):
                    return status, values
            n = len(self.msgs)
            self.planner.spin(0.05)
        raise AssertionError(f"no /diagnostics status as expected within {timeout} s; last: {values}")

    def state(self, expect: str):
        return self.until(lambda v: v["lifecycle_state"] == expect)
