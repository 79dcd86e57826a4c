"""/diagnostics content: names, the device, the lifecycle state, rollback depth in steps and seconds."""
import re
from collections import deque
from pathlib import Path

import pytest

from flashrt_ros.runtime import StoreUsage
from flashrt_ros.runtime.engine.backend import cuda_probe, select


def _stats(steps: int, rate_hz: float):
    from flashrt_ros.ros.io.stats import NodeStats
    stats = NodeStats(steps=steps)
    stats.latencies_ms = [0.5] * steps
    stats.step_times = deque(i / rate_hz for i in range(steps))
    return stats


def _values(msg):
    (status,) = msg.status
    return status, {kv.key: kv.value for kv in status.values}


BACKENDS = ["numpy"] + (["cuda"] if cuda_probe() is None else [])  # on a GPU machine both run, none is skipped


@pytest.mark.parametrize("backend", BACKENDS)
def test_hardware_id_names_the_device_the_policy_runs_on(backend):
    from flashrt_ros.ros.io.diagnostics import cpu_model, device_name
    name = device_name(select(backend))
    if backend == "cuda":  # the GPU's name and compute capability
        assert re.fullmatch(r".+ \(sm_\d+\)", name)
        return
    assert name == cpu_model() and name not in ("", "numpy")
    info = Path("/proc/cpuinfo")
    models = re.findall(r"^model name\s*:\s*(.+)$", info.read_text(), re.M) if info.exists() else []
    if models:
        assert name == models[0].strip()


def test_status_is_named_without_the_leading_slash_and_reports_rollback_depth_in_seconds():
    from flashrt_ros.ros.io.diagnostics import diagnostics_message
    usage = StoreUsage(capsules=51, pinned=1, capacity=128, bytes_used=1000, budget_bytes=4000, oldest_step=50,
                       newest_step=100, log_entries_used=100, log_entries_total=400)
    msg = diagnostics_message("/robot1/flashrt", "active", "some CPU", _stats(100, 100.0), None, usage, 10.0)
    status, values = _values(msg)
    assert status.name == "robot1/flashrt: runtime" and status.hardware_id == "some CPU"
    assert values["rollback_depth_steps"] == "50" and float(values["rollback_depth_s"]) == 0.5
    assert values["observed_step_rate_hz"] == "100.0" and values["kv_log_use_percent"] == "25.0"
    assert status.level == status.OK


def test_an_inactive_node_reports_its_state_as_a_warning_not_silence():
    from flashrt_ros.ros.io.diagnostics import diagnostics_message
    msg = diagnostics_message("/flashrt", "inactive", "some CPU", _stats(0, 100.0), None, None, 10.0)
    status, values = _values(msg)
    assert status.level == status.WARN and "inactive" in status.message
    assert values["lifecycle_state"] == "inactive" and values["steps"] == "0"


def test_a_step_p99_over_the_deadline_is_a_warning_naming_both_and_one_slow_step_in_a_hundred_is_not():
    from flashrt_ros.ros.io.diagnostics import diagnostics_message
    stats = _stats(100, 100.0)
    stats.latencies_ms = [0.5] * 99 + [20.0]  # p99 0.695 ms: under the 10 ms deadline
    status, _ = _values(diagnostics_message("/flashrt", "active", "some CPU", stats, None, None, 10.0))
    assert status.level == status.OK and status.message == "ok"
    stats.latencies_ms = [0.5] * 98 + [20.0] * 2  # p99 20 ms
    status, values = _values(diagnostics_message("/flashrt", "active", "some CPU", stats, None, None, 10.0))
    assert status.level == status.WARN and status.message == "step p99 20.00 ms > step_deadline_ms 10.0"
    assert values["step_latency_p99_ms"] == "20.000"


def test_capsules_the_store_could_not_take_are_a_warning():
    from flashrt_ros.ros.io.diagnostics import diagnostics_message
    stats = _stats(100, 100.0)
    stats.capsule_errors = 2  # snapshots refused: a store full of pins
    status, values = _values(diagnostics_message("/flashrt", "active", "some CPU", stats, None, None, 10.0))
    assert status.level == status.WARN and status.message == "capsules missing (store full of pins?)"
    assert values["capsule_errors"] == "2"


def test_a_persisting_node_is_ok_warns_while_records_are_dropped_and_is_ok_again_once_drops_stop(tmp_path):
    from diagnostic_msgs.msg import DiagnosticStatus
    from persist_fixtures import settings

    from conftest import observation_trace, small_config
    from flashrt_ros.ros.io.diagnostics import diagnostics_message
    from flashrt_ros.runtime import Session
    obs, stats = observation_trace(12), _stats(100, 100.0)
    s = Session(small_config())
    s.enable_persistence(settings(tmp_path))
    try:
        def status():
            return _values(diagnostics_message("/flashrt", "active", "some CPU", stats, s, None, 10.0))[0]
        for o in obs[:4]:
            s.step(o)
        assert s.persistence.flush()
        assert (status().level, status().message) == (DiagnosticStatus.OK, "ok")
        s.persistence.log._queue_cap = 0  # noqa: SLF001 - nothing fits: the disk is behind
        for o in obs[4:7]:
            s.step(o)
        got = status()
        assert got.level == DiagnosticStatus.WARN
        assert got.message == "persist: 3 records dropped, the disk is behind or failing (queue full)"
        s.persistence.log._queue_cap = 1 << 30  # noqa: SLF001 - room again
        for o in obs[7:]:
            s.step(o)
        assert s.persistence.flush()
        assert (status().level, status().message) == (DiagnosticStatus.OK, "ok")
    finally:
        s.disable_persistence()
