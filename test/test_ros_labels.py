"""Refused huge strings in service requests on a real node: 16 snapshot requests with a 16 MiB label
are refused, leave the node's memory where a couple of requests put it (no growth with the count), and
leave the live state and the store byte-identical."""
import numpy as np
import pytest
from ros_harness import reference_session

from conftest import observation_trace

pytestmark = pytest.mark.ros

HUGE = 16 << 20  # characters
MIB = 1 << 20


def _rss_bytes(pid: int) -> int:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def _store(client):
    r = client.list_capsules()
    return r.live_capsule_id, [(c.id, c.parent_id, c.step, c.label, c.pinned) for c in r.capsules], r.bytes_used


def test_huge_labels_are_refused_without_keeping_memory_and_change_nothing(flashrt):
    proc, planner = flashrt
    client = planner.client
    ref = reference_session()
    obs = observation_trace(4)
    for o in obs[:3]:
        assert np.asarray(planner.step(o).action, np.float32).tobytes() == ref.step(o).action.tobytes()
    before = _store(client)
    huge = "x" * HUGE
    rss = []
    start = _rss_bytes(proc.proc.pid)
    for _ in range(16):
        r = client.snapshot(label=huge, timeout_s=60.0)
        assert not r.success and f"got {HUGE}" in r.message and "256" in r.message
        rss.append(_rss_bytes(proc.proc.pid))
    # Receiving a 16 MiB request costs the transport a few transient copies (rmw, rclpy), reused by the
    # next one; the node itself keeps nothing of a refused request. The allocator may still keep one more
    # such copy once (an arena of another thread, a heap not trimmed): flat at rest, +18.5 MB once at a
    # load average of 8. A leak grows with the count: keeping even a quarter of each label (4 MiB) over
    # these 12 requests passes 3 labels, and the leak this guards against kept ~14 MB a request (168 MB).
    assert rss[-1] - rss[3] <= 3 * HUGE, [m // MIB for m in rss]
    assert rss[-1] - start <= 5 * HUGE, [m // MIB for m in rss]  # 16 requests once kept 226 MB
    assert _store(client) == before
    assert np.asarray(planner.step(obs[3]).action, np.float32).tobytes() == ref.step(obs[3]).action.tobytes()
