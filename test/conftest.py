"""Shared fixtures. ROS-touching tests get their own ROS_DOMAIN_ID and log dir (see ros_env)."""
from __future__ import annotations

import importlib.util
import os
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
from hypothesis import Phase, settings

# `make mutate` only needs to know that a property fails, not the smallest example: no shrinking there.
settings.register_profile("mutate", phases=(Phase.explicit, Phase.reuse, Phase.generate), deadline=None)
settings.load_profile(os.environ.get("FLASHRT_HYPOTHESIS_PROFILE", "default"))

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "test"))

# Never let DDS discovery leave this machine, even for a test started by hand.
os.environ["ROS_AUTOMATIC_DISCOVERY_RANGE"] = "LOCALHOST"
os.environ.setdefault("ROS_LOG_DIR", "/tmp/flashrt-test-roslog")
# The compiled CPU backend reads the cache every entry point uses (numba_cache.py; `make setup` fills it).

from hang_guard import hang_guard, pytest_configure  # noqa: E402, F401  a hung test ends the run, stacks shown

from flashrt_ros.runtime import PolicyConfig, Session  # noqa: E402

# PyTorch lives in .venv-train alone (make test-train), the ROS wheels in .venv and .venv-jazzy: elsewhere those
# test files are not collected at all, so a venv without them neither fails on their imports nor reports them
# skipped (they are the `train` and `ros` markers' files, which such a venv deselects anyway).
collect_ignore_glob = [glob for glob, module in (("test_train_*.py", "torch"), ("test_ros_*.py", "rclpy"))
                       if importlib.util.find_spec(module) is None]


# The fixtures that give a test a ROS graph (a domain of its own, nodes on it); a test that reserves a domain
# some other way carries the `graph` marker itself (ros_harness.fresh_domain refuses a test without it).
GRAPH_FIXTURES = {"ros_domain"}


def pytest_collection_modifyitems(items):
    """Markers from what a test does. `ros` (needs the ROS 2 wheels): every test in a test_ros_*.py file and every
    `graph` test, so `-m "not ros"` (make test-compat, a venv without ROS) selects exactly the tests that need no ROS
    wheels. `graph` (starts nodes, needs DDS): every user of a graph fixture. `train` (PyTorch, make test-train):
    every test in a test_train_*.py file."""
    for item in items:
        fixtures = set(getattr(item, "fixturenames", ()))
        if fixtures & GRAPH_FIXTURES:
            item.add_marker(pytest.mark.graph)
        if item.path.name.startswith("test_ros_") or item.get_closest_marker("graph"):
            item.add_marker(pytest.mark.ros)
        if item.path.name.startswith("test_train_"):
            item.add_marker(pytest.mark.train)
    # the modules that start nodes (the slowest) first, each kept whole (make test hands each xdist worker whole
    # files): two workers end together, not one of them on a last node test while the other is idle
    slow = {item.path for item in items if item.get_closest_marker("graph")}
    items.sort(key=lambda item: item.path not in slow)


@pytest.hookimpl(tryfirst=True)  # before the test's fixtures are set up
def pytest_runtest_setup(item):
    import ros_harness
    ros_harness.GRAPH_TEST = item.get_closest_marker("graph") is not None


CPU_BACKENDS = ["numpy", "cpu"]  # the reference and the compiled CPU step: one contract


def small_config(**kw) -> PolicyConfig:
    """Small but complete: every state kind, a window that wraps within a short test."""
    base = dict(d_model=32, n_layers=2, n_heads=2, kv_window=48, chunk_len=4, capsule_capacity=96,
                capsule_budget_mb=64.0, max_branches=8)
    base.update(kw)
    return PolicyConfig(**base)


def observation_trace(n: int, obs_dim: int = 14, seed: int = 0) -> np.ndarray:
    """A smooth synthetic joint trace: positions then velocities, [n, obs_dim] float32."""
    t = np.arange(n)[:, None] * 0.01
    j = np.arange(obs_dim // 2)[None, :]
    rng = np.random.default_rng(seed)
    pos = np.sin(2 * np.pi * (0.3 + 0.1 * j) * t + j) + 0.05 * rng.standard_normal((n, obs_dim // 2))
    vel = np.diff(pos, axis=0, prepend=pos[:1]) * 100.0
    out = np.concatenate([pos, vel], axis=1)
    if out.shape[1] < obs_dim:
        out = np.pad(out, ((0, 0), (0, obs_dim - out.shape[1])))
    return out.astype(np.float32)


def assert_states_close(got: dict, want: dict, atol: float) -> None:
    """Two full states (Session.state_tensors): integer buffers (meta) equal, float ones within atol
    (only where the math differs: another backend, GEMM vs GEMV order)."""
    assert list(got) == list(want)
    for name, w in want.items():
        if w.dtype.kind == "i":
            assert np.array_equal(got[name], w), name
        else:
            np.testing.assert_allclose(got[name], w, rtol=0, atol=atol, err_msg=name)


def assert_refused_unchanged(session, fn, exc, match) -> None:
    """``fn`` raises ``exc`` matching ``match``, and the live state, capsule and store are as before."""
    def snap():
        return (session.state_host().tobytes(), session.live_capsule_id, session.step_count,
                [c.id for c in session.list_capsules()])
    before = snap()
    with pytest.raises(exc, match=match):
        fn()
    assert snap() == before


@pytest.fixture
def session() -> Session:
    return Session(small_config())


@pytest.fixture
def stepped() -> Session:
    """A session 30 steps in, a capsule after each (files override it where they need another)."""
    s = Session(small_config())
    for o in observation_trace(30):
        s.step(o)
    return s


@pytest.fixture
def trace() -> np.ndarray:
    return observation_trace(400)


@pytest.fixture
def ros_domain(tmp_path):
    """A private ROS_DOMAIN_ID (another than the previous test's) and log dir; rclpy initialised on that
    domain in this process. Ports that killed processes left in the domain are removed first."""
    import rclpy
    from ros_harness import fresh_domain, ros_env

    with fresh_domain() as did:
        env = ros_env(did, tmp_path / "roslog")
        os.environ["ROS_DOMAIN_ID"] = str(did)
        rclpy.init(domain_id=did)
        try:
            yield env
        finally:
            rclpy.try_shutdown()


@pytest.fixture
def node_params():
    """Override in a test module to start the node with other parameters."""
    return {}


@pytest.fixture
def flashrt(ros_domain, tmp_path, node_params):
    """A running flashrt node (separate process) and a planner node in the test process."""
    from ros_harness import NodeProcess, Planner

    proc = NodeProcess(ros_domain, tmp_path / "node.log", capsule_dir=str(tmp_path / "capsules"), **node_params)
    planner = Planner()
    try:
        planner.wait_ready()
        yield proc, planner
    finally:
        planner.close()
        rc = proc.stop()
        out = proc.output()
        assert "Traceback" not in out, out[-3000:]
        assert rc == 0, f"node exited with {rc}:\n{out[-3000:]}"


class WatchedLock:
    """One of the session's RLocks, telling when a thread finds it held by another and waits for it."""

    def __init__(self, inner):
        self.inner, self.contended = inner, threading.Event()

    def acquire(self, blocking=True, timeout=-1):
        if self.inner.acquire(blocking=False):
            return True
        self.contended.set()
        return self.inner.acquire(blocking, timeout)

    def release(self):
        self.inner.release()

    def __enter__(self):
        return self.acquire()

    def __exit__(self, *exc):
        self.release()
