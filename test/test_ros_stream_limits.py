"""The capsule stream's limits over ROS (issue 44, point 6): a node at the README's Jetson window (kv_window
16384, the default model) activates with the default stream, and steps with it."""
from __future__ import annotations

import pytest

from conftest import observation_trace

pytestmark = pytest.mark.ros


@pytest.fixture
def node_params():
    # the default model (d_model 128 x 4 layers): 64 MiB per whole-window record at 16384, which a 16 MiB stream
    # queue refused at activate ("cannot hold two whole-window records"); the budget of the README's table
    return {"kv_window": 16384, "capsule_budget_mb": 512.0, "capsule_capacity": 0}


def test_a_node_at_kv_window_16384_activates_with_the_default_stream_and_streams(flashrt):
    proc, planner = flashrt
    out = proc.output()
    assert "now active" in out and "capsule records on" in out, out[-3000:]
    for o in observation_trace(3):
        planner.step(o, timeout=60.0)
    assert "cannot hold" not in proc.output()
