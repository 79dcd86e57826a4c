"""Not a workaround: the Linux scheduling the node's parameters ask for (off by default).

thread_priority: SCHED_FIFO for the thread that steps observations, as ros2_control's controller_manager
does for its control loop (realtime_tools::configure_sched_fifo), but off by default here. replan_nice: a
nice value for the replan worker, which needs no privilege (bulk work yields the cores).

Only the calling thread changes (Linux schedules threads one by one, by their thread id), and with
SCHED_RESET_ON_FORK: threads it starts later (service workers, the persistence writer of a later
configure) run with normal scheduling, not at its priority. The replan worker keeps normal scheduling:
a batched replan is bulk work that may run for its whole deadline, and at FIFO it would keep DDS and the
other threads off its core for that long.
"""
from __future__ import annotations

import os
import threading

HOW_TO_ALLOW = ("to allow it, raise the process's real-time priority limit (a hard limit 'rtprio 99' for the "
                "user in /etc/security/limits.conf, then `ulimit -r 99` in the shell that starts the node) or "
                "give it CAP_SYS_NICE (a container: --cap-add=SYS_NICE)")


def apply_thread_priority(priority: int, logger) -> bool:
    """The calling thread runs SCHED_FIFO at `priority` (1..99; 0 = leave it as it is). True if applied.
    Where the process is not allowed, one warning that says how to allow it; the thread keeps running
    with normal scheduling."""
    if priority == 0:
        return False
    tid = threading.get_native_id()
    try:
        os.sched_setscheduler(tid, os.SCHED_FIFO | os.SCHED_RESET_ON_FORK, os.sched_param(priority))
    except PermissionError:
        logger.warning(f"thread_priority {priority}: this process may not use SCHED_FIFO at that priority, so "
                       f"observations are stepped with normal scheduling; {HOW_TO_ALLOW}")
        return False
    except (AttributeError, OSError) as e:  # not Linux, or a kernel without real-time scheduling
        logger.warning(f"thread_priority {priority}: SCHED_FIFO is not available here ({e}); observations "
                       "are stepped with normal scheduling")
        return False
    logger.info(f"thread_priority: the thread that steps observations (tid {tid}) runs SCHED_FIFO at "
                f"priority {priority}")
    return True


def apply_thread_nice(nice: int, logger) -> bool:
    """Raise the calling thread's nice value to `nice` (1..19) if it is lower; 0 leaves it alone. Never lowers
    it (that needs a privilege), so a thread started under `nice` keeps its own and a lower value set later
    takes effect at the next start. Threads it starts later inherit it. True if it runs at >= `nice` now."""
    if nice <= 0:
        return True
    tid = threading.get_native_id()
    try:
        if os.getpriority(os.PRIO_PROCESS, tid) >= nice:
            return True
        os.setpriority(os.PRIO_PROCESS, tid, nice)
    except (AttributeError, OSError) as e:  # not Linux
        logger.warning(f"replan_nice {nice}: per-thread nice values are not available here ({e})",
                       throttle_duration_sec=60.0)
        return False
    return True
