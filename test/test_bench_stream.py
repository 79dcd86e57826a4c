"""`flashrt-bench stream --quick` end to end (toy sizes, real processes over DDS): every key of issue 18's
table is there, the byte-exactness keys hold, and the acceptance block judges each key (timings are the
full bench's business, not a test's)."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest import ROOT

pytestmark = pytest.mark.ros


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    from domain_coordinator import domain_id
    from ros_harness import ros_env

    tmp = tmp_path_factory.mktemp("bench")
    out = tmp / "stream.json"
    with domain_id() as did:  # its own ROS domain, LOCALHOST discovery, a private log dir
        res = subprocess.run([sys.executable, "-m", "flashrt_ros.tools.bench", "stream", "--quick", "--json",
                              str(out)], cwd=ROOT, env=ros_env(did, tmp / "roslog"), capture_output=True, text=True,
                             timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(out.read_text()), res


def test_every_key_of_the_issue_is_reported_with_the_load_it_ran_under(quick):
    d, res = quick
    for key in ("stream_step_overhead", "replica_lag_ms", "replica_whatif_byte_exact", "late_replica",
                "failover_ms", "failover_actions_byte_identical", "failover_unstepped_observations", "seek_ratio",
                "seek", "standby_takeovers_while_primary_lived", "acceptance", "machine"):
        assert key in d, key
    assert d["stream_step_overhead"]["p99_ratio"] > 0 and "load_avg_before" in d["machine"]
    assert "stream: block 1/2" in res.stderr and "failover: kill 1/1" in res.stderr  # progress on stderr


def test_replicas_failover_and_seek_are_byte_exact_in_the_quick_run(quick):
    d, _ = quick
    w = d["replica_whatif_byte_exact"]
    assert w["run"] == 3 and w["passed"] == 3
    assert d["failover_ms"]["measured"] == 1 and d["failover_ms"]["p50"] > 0
    assert d["failover_actions_byte_identical"] == {"run": 1, "passed": 1}
    assert d["failover_unstepped_observations"] == 0
    assert d["late_replica"]["holds_every_capsule_since_first"] is True
    assert d["seek"]["byte_identical"] is True and d["seek"]["steps_after_from"] > 0
    assert d["standby_takeovers_while_primary_lived"]["takeovers"] == 0
    assert set(d["acceptance"]) >= {"stream_step_overhead.p99_ratio <= 1.1", "replica_lag_ms.p99 <= 20",
                                    "failover_ms.p99 <= 200 over 20 kills", "seek_ratio < 0.05"}
