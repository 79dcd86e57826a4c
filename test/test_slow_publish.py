"""The primary's WARN for a capsule record whose publish stalled: the first sign of a needless takeover."""
from flashrt_ros.ros.group.slow_publish import SLOW_PUBLISH_MS, slow_publish_line


def test_a_record_publish_past_the_threshold_is_logged_with_the_takeover_it_risks():
    assert slow_publish_line(5, SLOW_PUBLISH_MS) == ""
    line = slow_publish_line(7, 333.4)
    assert line.startswith("capsule record 7 took 333 ms to publish")
    assert "liveliness_lease_ms" in line
