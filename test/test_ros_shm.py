"""The start-up clean of /dev/shm against live DDS processes: every segment a living process holds stays, and
the node goes on talking (a node in its own process, over DDS)."""
import fcntl
import os
from pathlib import Path

import pytest

from conftest import observation_trace
from flashrt_ros.ros.platform.shm_segments import SEGMENT_LOCK

pytestmark = pytest.mark.ros

SHM = Path("/dev/shm")


def _held_segments() -> set[str]:
    held = set()
    for name in os.listdir(SHM):
        if SEGMENT_LOCK.match(name):
            with open(SHM / name, "rb") as lock:
                try:
                    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    fcntl.flock(lock, fcntl.LOCK_UN)
                except OSError:
                    held.add(name[:-3])
    return held


@pytest.mark.skipif(not SHM.is_dir(), reason="no /dev/shm on this OS")
def test_cleaning_dead_segments_keeps_every_live_processs_segment_and_the_node_talking(flashrt):
    from flashrt_ros.ros.platform.shm_segments import remove_dead_segments
    proc, planner = flashrt
    planner.run(observation_trace(3))
    held = _held_segments()
    assert len(held) >= 2, held  # the node's and this test process's
    remove_dead_segments(min_age_s=0.0)  # no age margin: only the locks decide
    left = set(os.listdir(SHM))
    assert held <= left and {f"{s}_el" for s in held} <= left
    assert planner.run(observation_trace(5)).shape == (5, 7)  # both ends still reach each other
    assert "DDS profile:" in proc.output()
