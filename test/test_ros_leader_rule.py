"""Who leads when two nodes claim the robot (group/claims.outranks, no ROS graph): the newest epoch, then the earlier
claim. Two standbys that take over at once claim the same epoch: exactly one of them must stand down, and both
must agree which, or each deposes the other and nobody steps the robot."""
from __future__ import annotations

from builtin_interfaces.msg import Time

from flashrt_interfaces.msg import Leader
from flashrt_ros.ros.group.claims import outranks


def claim(node: str, epoch: int, stamp_ns: int) -> Leader:
    return Leader(stamp=Time(sec=stamp_ns // 10**9, nanosec=stamp_ns % 10**9), epoch=epoch, node=node)


def beats(theirs: Leader, ours: Leader) -> bool:
    """What ``ours``'s node decides on hearing ``theirs``."""
    return outranks(theirs, ours.epoch, ours.stamp.sec * 10**9 + ours.stamp.nanosec)


def test_of_two_claims_of_one_epoch_the_earlier_leads_and_the_later_stands_down():
    earlier, later = claim("/robot/standby_a", 2, 7_000_000_000), claim("/robot/standby_b", 2, 7_000_000_001)
    assert beats(earlier, later)  # standby_b hears standby_a's claim: deposed
    assert not beats(later, earlier)  # standby_a hears standby_b's: keeps leading


def test_the_earlier_claim_is_told_by_the_whole_stamp_across_a_second_boundary():
    earlier, later = claim("/robot/a", 3, 4_999_999_999), claim("/robot/b", 3, 5_000_000_000)
    assert beats(earlier, later) and not beats(later, earlier)


def test_a_claim_does_not_outrank_one_of_the_same_epoch_and_stamp():
    mine = claim("/robot/a", 2, 7_000_000_000)
    assert not beats(claim("/robot/b", 2, 7_000_000_000), mine)


def test_a_newer_epoch_leads_whenever_it_was_claimed():
    old_primary, standby = claim("/robot/primary", 1, 9_000_000_000), claim("/robot/standby", 2, 1_000_000_000)
    assert beats(standby, old_primary) and not beats(old_primary, standby)
