"""A joint-state sensor: publishes sensor_msgs/JointState on `observation` at a fixed rate.

    python -m flashrt_ros.tools.demo.sensor_sim --rate 100 --duration 20 --namespace /robot1

Positions and velocities of a 7-joint arm following smooth sinusoids with sensor noise.
"""
from __future__ import annotations

import argparse
import sys
import time

import rclpy
from rclpy.executors import ExternalShutdownException
from rclpy.qos import qos_profile_sensor_data
from sensor_msgs.msg import JointState

from ..common import synthetic_trace


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="sensor_sim", description=__doc__)
    ap.add_argument("--rate", type=float, default=100.0, help="Hz")
    ap.add_argument("--duration", type=float, default=10.0, help="seconds (0 = forever)")
    ap.add_argument("--namespace", default="", help="namespace of the flashrt node")
    ap.add_argument("--joints", type=int, default=7)
    ap.add_argument("--subscribers", type=int, default=1,
                    help="start publishing once this many subscribers are matched (best-effort: none is lost "
                         "to discovery)")
    args, ros_args = ap.parse_known_args(argv)
    rclpy.init(args=ros_args)
    node = rclpy.create_node("sensor_sim", namespace=args.namespace or None)
    pub = node.create_publisher(JointState, "observation", qos_profile_sensor_data)
    names = [f"joint{i}" for i in range(args.joints)]
    n = int(args.rate * args.duration) if args.duration > 0 else 10**12
    trace_len = int(args.rate * 60)
    trace = synthetic_trace(trace_len, 2 * args.joints)
    period = 1.0 / args.rate
    sent = 0
    try:
        while pub.get_subscription_count() < args.subscribers:
            time.sleep(0.02)
        next_t = time.monotonic()
        for i in range(n):
            o = trace[i % trace_len]
            msg = JointState(name=names, position=[float(v) for v in o[:args.joints]],
                             velocity=[float(v) for v in o[args.joints:]])
            msg.header.stamp = node.get_clock().now().to_msg()
            pub.publish(msg)
            sent += 1
            next_t += period
            delay = next_t - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            elif delay < -period:  # descheduled: skip the missed samples, as a real driver does, no burst
                next_t = time.monotonic()
    except (KeyboardInterrupt, ExternalShutdownException):
        pass
    finally:
        print(f"sensor_sim: sent {sent}", flush=True)
        node.destroy_node()
        rclpy.try_shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
