"""rclpy's own bytes, against the committed rclpy bags (test/fixtures/data) and flashrt-replay's decoder."""
import itertools

import pytest
from fixtures.make_bags import JS, RCLPY_BAGS, rclpy_bag, rclpy_joint_states, read_raw
from rclpy.serialization import deserialize_message, serialize_message
from sensor_msgs.msg import JointState
from std_msgs.msg import Float32MultiArray, Float64MultiArray, MultiArrayDimension

from flashrt_ros.tools.replay.bags import decode_cdr, fastcdr_estimate, typestore


@pytest.mark.parametrize("storage", ["mcap", "sqlite3"])
@pytest.mark.parametrize("kind", sorted(RCLPY_BAGS))
def test_committed_rclpy_bags_hold_what_rclpy_serialises_today(kind, storage):
    """Byte for byte except where rclpy leaves memory uninitialised (alignment padding, the trailing bytes),
    which differs from run to run: there, both must be where rosbags' own serialisation has zeros."""
    ts = typestore()
    fresh, committed = rclpy_joint_states(kind), read_raw(rclpy_bag(kind, storage))
    assert [ns for ns, _ in committed] == [ns for ns, _ in fresh]
    for (_, old), (_, new) in zip(committed, fresh):
        assert len(old) == len(new) and old[:4] == new[:4]
        assert deserialize_message(old, JointState) == deserialize_message(new, JointState)
        canonical = bytes(ts.serialize_cdr(decode_cdr(ts, old, JS), JS)).ljust(len(old), b"\0")
        assert all(a == b or c == 0 for a, b, c in zip(old, new, canonical))


def _joint_states():
    for frame, names, npos, nvel, neff in itertools.product(range(9), range(3), range(3), range(3), range(3)):
        yield JointState(name=["j" * (k + 1) for k in range(names)], position=[1.0] * npos, velocity=[2.0] * nvel,
                         effort=[3.0] * neff), JS, frame


def _arrays():
    types = ((Float32MultiArray, "std_msgs/msg/Float32MultiArray"),
             (Float64MultiArray, "std_msgs/msg/Float64MultiArray"))
    for (cls, typename), dims, label, n, offset in itertools.product(types, range(3), range(6), range(4), (0, 1)):
        msg = cls(data=[0.5] * n)
        msg.layout.dim = [MultiArrayDimension(label="l" * label, size=3, stride=3) for _ in range(dims)]
        msg.layout.data_offset = offset
        yield msg, typename, None


def test_decoder_sizes_every_observation_message_as_rclpy_does():
    """Fast-CDR's estimate (what serialize_message's buffer holds) over empty and non-empty arrays and every
    alignment of what precedes them: the decoder accepts exactly that many bytes and not one more."""
    ts = typestore()
    seen = set()
    for msg, typename, frame in itertools.chain(_joint_states(), _arrays()):
        if frame is not None:
            msg.header.frame_id = "x" * frame
        raw = bytes(serialize_message(msg))
        decoded = decode_cdr(ts, raw, typename)
        assert len(raw) - 4 == fastcdr_estimate(ts, decoded, typename)
        seen.add(len(raw) - len(ts.serialize_cdr(decoded, typename)))
        with pytest.raises(Exception, match="size mismatch"):
            decode_cdr(ts, raw + b"\0" * 4, typename)
    assert seen == {0, 4, 8, 12}  # the trailing byte counts rclpy leaves on these types
