"""/diagnostics content: one DiagnosticStatus for the runtime."""
from __future__ import annotations

import numpy as np
from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus, KeyValue


def diagnostics_message(node, stats, session, step_deadline_ms: float) -> DiagnosticArray:
    lat = np.asarray(stats.latencies_ms[-1000:], dtype=np.float64)
    p50, p99 = (float(np.percentile(lat, 50)), float(np.percentile(lat, 99))) if lat.size else (0.0, 0.0)
    values = {
        "backend": session.backend.name if session else "unconfigured",
        "steps": stats.steps,
        "step_latency_p50_ms": f"{p50:.3f}",
        "step_latency_p99_ms": f"{p99:.3f}",
        "step_deadline_misses": stats.step_deadline_misses,
        "rejected_inputs": stats.rejected,
        "held_observations": stats.held,
        "capsule_errors": stats.capsule_errors,
        "replans": stats.replans,
        "replans_rejected": stats.replans_rejected,
        "replan_deadline_misses": stats.replan_deadline_misses,
    }
    if session is not None:
        u = session.store_usage()
        values.update(capsules_used=u.capsules, capsules_pinned=u.pinned, capsule_capacity=u.capacity,
                      capsule_bytes_used=u.bytes_used, capsule_budget_bytes=u.budget_bytes,
                      rollback_depth_steps=u.rollback_depth_steps, kv_log_entries_used=u.log_entries_used,
                      kv_log_entries_total=u.log_entries_total, live_capsule_id=session.live_capsule_id)
    level, message = DiagnosticStatus.OK, "ok"
    if session is None:
        level, message = DiagnosticStatus.WARN, "not configured"
    elif p99 > step_deadline_ms:
        level, message = DiagnosticStatus.WARN, f"step p99 {p99:.2f} ms > step_deadline_ms {step_deadline_ms}"
    elif stats.capsule_errors:
        level, message = DiagnosticStatus.WARN, "capsules missing (store full of pins?)"
    status = DiagnosticStatus(level=level, name=f"{node.get_fully_qualified_name()}: runtime", message=message,
                              hardware_id=values["backend"],
                              values=[KeyValue(key=k, value=str(v)) for k, v in values.items()])
    return DiagnosticArray(status=[status])
