"""Publishes that stalled (ROS-free: the wait is passed in, so it is unit-tested without a ROS graph): a
publish that waits holds the node's other publishes and its liveliness as long, which is what makes a standby
take over from a living primary."""
from __future__ import annotations

SLOW_PUBLISH_MS = 100.0  # a publish past this is logged (a 4 MiB capsule keyframe takes ~9 ms here)


def slow_publish_line(seq: int, waited_ms: float) -> str:
    """A WARN line for a record whose publish took over SLOW_PUBLISH_MS ('' otherwise): what makes a standby take
    over from a living primary shows here first."""
    if waited_ms <= SLOW_PUBLISH_MS:
        return ""
    return (f"capsule record {seq} took {waited_ms:.0f} ms to publish (a starved process, or Fast DDS waiting inside "
            "the send, as when it checks a newly seen reader's shared-memory port); the node's other publishes and "
            "its liveliness can wait as long, so a standby with a shorter liveliness_lease_ms may take over")
