"""The flashrt_node process: start-up (the platform workarounds that must run before rclpy.init), signals, the
spin loop and an ordered teardown with a watchdog. The node itself is node.py.

Run: ``ros2 run flashrt_ros flashrt_node --ros-args --params-file config/flashrt.yaml``
(or ``python -m flashrt_ros.ros.main``)
"""
# ruff: noqa: E402 (the SIGINT line goes before the slow imports)
from __future__ import annotations

import faulthandler
import signal
import sys
import threading
import time

# Before the imports below (rclpy and the runtime: seconds on a loaded machine): a SIGINT while they load ends the
# process by the default action, as main() has it until the node exists, not as a KeyboardInterrupt traceback
# from whichever module was loading (a launcher stopping a node it had just started printed one).
signal.signal(signal.SIGINT, signal.SIG_DFL)

import rclpy
from rclpy.executors import ExternalShutdownException, SingleThreadedExecutor
from rclpy.lifecycle import TransitionCallbackReturn

from .declare import start_up_value
from .node import NODE_NAME, FlashRTNode, one_line
from .params import check_node_param
from .platform.dds_profile import default_fast_dds_ports, use_shipped_profile
from .platform.dead_participants import HeldIds, hold_dead_participant_ids, own_participant_ids, planted_port_files
from .platform.freed_memory import keep_freed_memory
from .platform.realtime import apply_thread_priority
from .platform.shm_segments import removal_line, remove_dead_segments, skipped_line


def _init_ros(args) -> None:
    """rclpy.init without rclpy's signal handlers: on SIGINT the node must stop its replan worker
    while the context is still valid (rclpy's handler would shut the context down under it)."""
    try:
        from rclpy.signals import SignalHandlerOptions
        rclpy.init(args=args, signal_handler_options=SignalHandlerOptions.NO)
    except (ImportError, TypeError):  # an rclpy without the option
        rclpy.init(args=args)




def spin_until_stopped(executor, node, stop: threading.Event) -> None:
    while not stop.is_set() and rclpy.ok():
        try:
            executor.spin_once(timeout_sec=0.1)  # wakes at least every 0.1 s to see a stop request
        except (KeyboardInterrupt, ExternalShutdownException):
            return
        except Exception as e:  # noqa: BLE001 - a callback's error must not take the robot's policy down
            node.get_logger().error(f"callback failed: {type(e).__name__}: {one_line(e)}",
                                    throttle_duration_sec=1.0)


# Fast DDS 3.2 can deadlock destroying a participant while a peer leaves (eProsima/Fast-DDS#6502): the process
# would never exit, and a launch file or systemd would wait on it. Past this limit after the runtime is released
# (the capsule log flushed), every thread's stack goes to stderr and the process exits 1 without the rest.
TEARDOWN_LIMIT_S = 20.0
# SIGINT / SIGTERM end the node within this, whatever it is doing: a start-up blocked in a system call (a FIFO
# planted where a file was expected once hung it for good, SIGTERM ignored), a configure still compiling, or
# the teardown above. Past it every thread's stack goes to stderr and the process exits 1 (the capsule log is
# safe against that, as against kill -9). Under 5 s: systemd's and launch's SIGKILL come later.
SIGNAL_EXIT_LIMIT_S = 4.0


def main(args=None) -> int:
    # Until the node exists, SIGINT / SIGTERM end the process at once (the default action): there is nothing to
    # shut down in order yet, and a start-up stuck inside rclpy (Fast DDS waiting on a file planted in /dev/shm)
    # runs no Python signal handler. From then on they only ask the loop to stop: shutdown runs in order
    # (replan worker, services, node, context) and exits 0, even mid-configure or mid-replan, within
    # SIGNAL_EXIT_LIMIT_S (else exit 1 with every thread's stack).
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_DFL)
    stop = threading.Event()
    exit_by: list[float] = []  # when a signal came: the process ends by exit_by[0]

    def on_signal(*_):
        stop.set()
        if not exit_by:  # a C-level watchdog: it fires even while this thread is stuck in a call
            exit_by.append(time.monotonic() + SIGNAL_EXIT_LIMIT_S)
            faulthandler.dump_traceback_later(SIGNAL_EXIT_LIMIT_S, exit=True)

    if hasattr(signal, "SIGUSR1"):  # kill -USR1: every thread's stack to stderr, the node runs on (a hung node)
        faulthandler.register(signal.SIGUSR1, all_threads=True)
    argv = args if args is not None else sys.argv
    # before rclpy.init: the participant takes its id, and Fast DDS reads its profile, when it starts
    port_formula = default_fast_dds_ports()  # else the ids cannot be told from the ports
    hold = start_up_value(argv, NODE_NAME, "hold_dead_participant_ids")
    held_ids = hold_dead_participant_ids(hold=hold) if port_formula else HeldIds(0)
    planted = planted_port_files(held_ids.domain_id) if port_formula else []
    if planted:
        held_ids.release()
        print(f"flashrt: cannot start: {', '.join(planted)} named as Fast DDS shared-memory port files of domain "
              f"{held_ids.domain_id} but not regular files (planted?): Fast DDS would wait on them for good; remove "
              "them", file=sys.stderr)
        return 2
    dds_line = (use_shipped_profile() if start_up_value(argv, NODE_NAME, "use_shipped_dds_profile")
                else "DDS profile: none set (use_shipped_dds_profile is false)")
    try:
        _init_ros(argv)
    except Exception as e:  # noqa: BLE001 - e.g. a params file that is missing or not valid YAML
        held_ids.release()
        print(f"flashrt: cannot start: {one_line(e)}", file=sys.stderr)
        return 2
    code = 0
    node = executor = None
    try:
        node = FlashRTNode(argv=argv)
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, on_signal)
        held_ids.release()  # the participant exists
        node.get_logger().info(dds_line)
        participant_line = held_ids.line(own_participant_ids(held_ids.domain_id) if port_formula else [])
        if participant_line:
            node.get_logger().info(participant_line)
        if check_node_param("keep_freed_memory", node.get_parameter("keep_freed_memory").value):
            node.get_logger().info(keep_freed_memory())  # before configure's large allocations
        skipped = list(held_ids.skipped)
        if check_node_param("clean_dead_shm_segments", node.get_parameter("clean_dead_shm_segments").value):
            removed_line = removal_line(*remove_dead_segments(skipped=skipped))
            if removed_line:
                node.get_logger().info(removed_line)
        if skipped:
            node.get_logger().warning(skipped_line(skipped))
        # SingleThreaded, not EventsExecutor: rclpy 9.1's EventsExecutor hung at 100% CPU serving an
        # action goal here (even a plain synchronous one); see README. Humble has no EventsExecutor anyway.
        executor = SingleThreadedExecutor()
        executor.add_node(node)
        if check_node_param("autostart", node.get_parameter("autostart").value) and not stop.is_set():
            if node.trigger_configure() != TransitionCallbackReturn.SUCCESS:
                code = 1
            elif node.trigger_activate() != TransitionCallbackReturn.SUCCESS:
                code = 1
        if code == 0:
            # this thread spins the executor, so it steps the observations: it gets thread_priority
            apply_thread_priority(check_node_param("thread_priority", node.get_parameter("thread_priority").value),
                                  node.get_logger())
            spin_until_stopped(executor, node, stop)
    except Exception as e:  # noqa: BLE001 - start-up errors: one line, not a traceback
        print(f"flashrt: {type(e).__name__}: {one_line(e)}", file=sys.stderr)
        code = 1
    finally:
        held_ids.release()
        if node is not None:
            node.release()  # the replan worker stops while the context still works
        # C-level: covers interpreter exit too; never later than a signal's limit
        limit = TEARDOWN_LIMIT_S if not exit_by else max(0.1, exit_by[0] - time.monotonic())
        faulthandler.dump_traceback_later(limit, exit=True)
        if executor is not None:
            executor.shutdown()
        if node is not None:
            node.destroy_node()
        rclpy.try_shutdown()
    return code


if __name__ == "__main__":
    sys.exit(main())
