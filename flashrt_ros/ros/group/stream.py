"""The primary's capsule stream (issue 18): every capsule record of the timeline on ``~/capsule_stream``
(flashrt_interfaces/CapsuleRecord), published from the runtime's stream thread (runtime/persist/stream.py),
never the step's; and ``~/capsule_stream/resync`` (std_srvs/Trigger), which a subscriber that lost records
calls to get the live capsule again as a whole-window record.

The stream is reliable with a history of STREAM_DEPTH records: a subscriber that falls further behind
sees a gap in ``seq`` and asks for a resync rather than holding up the robot.
"""
from __future__ import annotations

import time

from builtin_interfaces.msg import Time
from rclpy.duration import Duration
from rclpy.qos import DurabilityPolicy, HistoryPolicy, LivelinessPolicy, QoSProfile, ReliabilityPolicy
from std_srvs.srv import Trigger

from flashrt_interfaces.msg import CapsuleRecord

from ..io.auth import record_mac
from ..io.convert import ns_to_stamp
from .slow_publish import slow_publish_line

STREAM_TOPIC = "~/capsule_stream"
RESYNC_SERVICE = "~/capsule_stream/resync"
STREAM_DEPTH = 200  # 2 s at 100 Hz


def stream_qos(lease_ms: float = 0.0) -> QoSProfile:
    """``lease_ms`` > 0: automatic liveliness with that lease (the primary offers it; a standby asks for it
    and hears within about one lease that the primary's process is gone). 0: the rmw's default."""
    qos = QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=STREAM_DEPTH, reliability=ReliabilityPolicy.RELIABLE,
                     durability=DurabilityPolicy.VOLATILE)
    if lease_ms > 0:
        qos.liveliness = LivelinessPolicy.AUTOMATIC
        qos.liveliness_lease_duration = Duration(nanoseconds=int(lease_ms * 1e6))
    return qos


def record_message(rec, fingerprint: str, epoch: int, key: bytes | None = None) -> CapsuleRecord:
    """``key``: the record carries its MAC under it (io/auth.py)."""
    msg = CapsuleRecord(stamp=ns_to_stamp(rec.stamp_ns, Time), seq=rec.seq, epoch=epoch, timeline=rec.timeline,
                        kind=rec.kind, capsule_id=rec.capsule_id, parent_id=rec.parent_id, step=rec.step,
                        fingerprint=fingerprint)
    msg.record = rec.blob  # uint8[]: an array.array, filled from the bytes in one copy
    if key is not None:
        msg.mac = record_mac(key, msg)
    return msg


class StreamPublisher:
    """The stream of one configured session, from activate to deactivate."""

    def __init__(self, node, session, keyframe_s: float, epoch: int, lease_ms: float):
        self.node, self.session, self.epoch = node, session, epoch
        self.fingerprint = session.fingerprint
        self.pub = node.create_publisher(CapsuleRecord, STREAM_TOPIC, stream_qos(lease_ms))
        self.srv = node.create_service(Trigger, RESYNC_SERVICE, self._on_resync)
        try:
            self.stream = session.enable_stream(self._publish, keyframe_s)
        except BaseException:
            self._destroy_entities()
            raise

    def _publish(self, rec) -> None:  # the stream thread
        msg = record_message(rec, self.fingerprint, self.epoch, self.session.capsule_hmac_key)
        t0 = time.monotonic()
        self.pub.publish(msg)
        line = slow_publish_line(rec.seq, (time.monotonic() - t0) * 1e3)
        if line:
            self.node.get_logger().warning(line, throttle_duration_sec=1.0)

    def _on_resync(self, request, response):
        try:
            resent = self.stream.request_resync()
            response.success = True
            response.message = ("the live capsule follows as a RESYNC" if resent
                                else "the next capsule record is a RESYNC")
        except Exception as e:  # noqa: BLE001 - a service handler survives every error
            response.success, response.message = False, f"resync failed: {type(e).__name__}: {e}"
        return response

    def stats(self):
        return self.stream.stats()

    def destroy(self) -> None:
        """Publish what is queued, then stop (the session keeps stepping without a stream)."""
        self.stream.flush(timeout_s=2.0)
        self.session.disable_stream()
        self._destroy_entities()

    def _destroy_entities(self) -> None:
        self.node.destroy_service(self.srv)
        self.node.destroy_publisher(self.pub)
