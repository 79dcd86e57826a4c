"""/diagnostics content: one DiagnosticStatus for the runtime, in every lifecycle state.

Follows diagnostic_updater's conventions: the status name is the node's name without the leading
slash (``robot1/flashrt: runtime``), and ``hardware_id`` names the device the policy runs on.
"""
from __future__ import annotations

import platform
from pathlib import Path

import numpy as np
from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus, KeyValue


def cpu_model() -> str:
    """The CPU model: /proc/cpuinfo's 'model name' (x86), else the board's model (a Jetson's
    /proc/device-tree/model), else what Python knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("model name", "Model", "Hardware") and value.strip():
                return value.strip()
    except OSError:
        pass
    try:
        model = Path("/proc/device-tree/model").read_text().strip("\x00 \n")
        if model:
            return model
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def device_name(backend) -> str:
    """What hardware_id reports: the GPU's name and compute capability on CUDA, the CPU model otherwise."""
    if getattr(backend, "name", "") == "cuda":
        try:
            import cupy
            dev = cupy.cuda.Device()
            props = cupy.cuda.runtime.getDeviceProperties(dev.id)
            name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
            return f"{name} (sm_{dev.compute_capability})"
        except Exception as e:  # noqa: BLE001 - a name is not worth failing diagnostics for
            return f"CUDA device ({type(e).__name__})"
    return cpu_model()


def observed_step_rate_hz(step_times) -> float:
    """Steps per second over the recent steps (0 when fewer than two)."""
    if len(step_times) < 2 or step_times[-1] <= step_times[0]:
        return 0.0
    return (len(step_times) - 1) / (step_times[-1] - step_times[0])


def diagnostics_message(name: str, lifecycle_state: str, hardware_id: str, stats, session, usage,
                        step_deadline_ms: float, role: tuple[dict, str] = ({}, "")) -> DiagnosticArray:
    """``usage``: the store's StoreUsage, or None when it could not be read without waiting. ``role``: the
    stream's or the replica's values, and a warning ("" = none) (replica.role_diagnostics)."""
    latencies, step_times = stats.recent()
    lat = np.asarray(latencies, dtype=np.float64)
    p50, p99 = (float(np.percentile(lat, 50)), float(np.percentile(lat, 99))) if lat.size else (0.0, 0.0)
    values = {
        "lifecycle_state": lifecycle_state,
        "backend": session.backend.name if session else "unconfigured",
        "steps": stats.steps,
        "step_latency_p50_ms": f"{p50:.3f}",
        "step_latency_p99_ms": f"{p99:.3f}",
        "step_deadline_misses": stats.step_deadline_misses,
        "rejected_inputs": stats.rejected,
        "joint_name_mismatches": stats.joint_name_mismatches,
        "capsule_errors": stats.capsule_errors,
        "steps_refused": stats.steps_refused,
        "replans": stats.replans,
        "replans_rejected": stats.replans_rejected,
        "replan_deadline_misses": stats.replan_deadline_misses,
        "stamps_from_node_clock": stats.stamps_from_clock,
        "stamps_in_future": stats.stamps_in_future,
    }
    if usage is not None:
        rate = observed_step_rate_hz(step_times)
        depth_s = usage.rollback_depth_steps / rate if rate > 0 else 0.0
        values.update(capsules_used=usage.capsules, capsules_pinned=usage.pinned, capsule_capacity=usage.capacity,
                      capsule_bytes_used=usage.bytes_used, capsule_budget_bytes=usage.budget_bytes,
                      rollback_depth_steps=usage.rollback_depth_steps, rollback_depth_s=f"{depth_s:.4g}",
                      observed_step_rate_hz=f"{rate:.1f}", kv_log_entries_used=usage.log_entries_used,
                      kv_log_entries_total=usage.log_entries_total,
                      kv_log_use_percent=f"{100.0 * usage.log_entries_used / max(1, usage.log_entries_total):.1f}")
    if session is not None:
        values["live_capsule_id"] = session.live_capsule_id
    persistence = getattr(session, "persistence", None)  # read once: cleanup may clear it meanwhile
    persist = persistence.stats() if persistence is not None else None
    if persist is not None:
        values.update(persist_records_written=persist.records_written, persist_records_dropped=persist.records_dropped,
                      persist_write_errors=persist.write_errors, persist_lag_ms=f"{persist.lag_ms:.1f}",
                      persist_queue_records=persist.queue_records, persist_fsync_ms_last=f"{persist.fsync_ms_last:.2f}",
                      persist_fsync_ms_max=f"{persist.fsync_ms_max:.2f}",
                      persist_log_mb=f"{persist.log_bytes / 2**20:.1f}", persist_segments=persist.segments,
                      persist_pins=persist.pins)
        if persist.last_error:
            values["persist_last_error"] = persist.last_error
    values.update(role[0])
    if stats.last_joint_name_error:
        values["last_joint_name_error"] = stats.last_joint_name_error
    mismatches = stats.joint_name_mismatches
    level, message = DiagnosticStatus.OK, "ok"
    refused = stats.step_refused_why or stats.steps_refused > stats.steps_refused_reported
    if lifecycle_state != "active":
        level, message = DiagnosticStatus.WARN, f"{lifecycle_state}: not stepping"
    elif mismatches > stats.joint_name_mismatches_reported:  # ERROR while they keep coming
        level, message = DiagnosticStatus.ERROR, (
            f"{mismatches - stats.joint_name_mismatches_reported} JointState(s) refused: their names do not "
            f"match joint_names ({stats.last_joint_name_error})")
    elif refused:  # ERROR until reported and a step succeeded again
        level, message = DiagnosticStatus.ERROR, f"steps refused ({stats.steps_refused}): {stats.step_refused_why}"
    elif p99 > step_deadline_ms:
        level, message = DiagnosticStatus.WARN, f"step p99 {p99:.2f} ms > step_deadline_ms {step_deadline_ms}"
    elif stats.capsule_errors:
        level, message = DiagnosticStatus.WARN, "capsules missing (store full of pins?)"
    elif persist is not None and persist.records_dropped > stats.persist_drops_reported:
        level, message = DiagnosticStatus.WARN, (f"persist: {persist.records_dropped} records dropped, the disk is "
                                                 f"behind or failing ({persist.last_error or 'queue full'})")
    elif role[1]:
        level, message = DiagnosticStatus.WARN, role[1]
    stats.joint_name_mismatches_reported = mismatches
    stats.steps_refused_reported = stats.steps_refused
    if persist is not None:
        stats.persist_drops_reported = persist.records_dropped  # WARN while drops keep coming, OK once they stop
    status = DiagnosticStatus(level=level, name=f"{name.lstrip('/')}: runtime", message=message,
                              hardware_id=hardware_id,
                              values=[KeyValue(key=k, value=str(v)) for k, v in values.items()])
    return DiagnosticArray(status=[status])
