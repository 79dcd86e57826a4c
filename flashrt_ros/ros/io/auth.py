"""Leader claims and capsule stream records authenticated with the node's key (issue 44.3): the key of
``capsule_hmac_key_file`` (runtime/state/capsule_file.py's load_hmac_key: at least 16 bytes, mode 0600), the one
capsule files carry their HMAC under. Every node of a robot that has the key signs what it sends (``mac``: an
HMAC-SHA256, hex) and takes only what carries a valid one; a node without a key sends ``mac`` empty and falls
back to the rules in group/claims.py (docs/leadership.md). Each kind of message has its own domain string, so a MAC of
one is never valid for another (nor for a capsule file's)."""
from __future__ import annotations

import hashlib
import hmac
import struct

LEADER_DOMAIN = b"flashrt-leader-claim\0"
RECORD_DOMAIN = b"flashrt-capsule-record\0"


def _mac(key: bytes, domain: bytes, *parts: bytes) -> str:
    h = hmac.new(key, domain, hashlib.sha256)
    for p in parts:
        h.update(struct.pack("<Q", len(p)))  # length-prefixed: no two field lists give the same bytes
        h.update(p)
    return h.hexdigest()


def _u64(*values: int) -> bytes:
    return struct.pack(f"<{len(values)}Q", *values)


def leader_mac(key: bytes, msg) -> str:
    """The MAC of a Leader message's fields (all but ``mac``)."""
    return _mac(key, LEADER_DOMAIN, _u64(msg.stamp.sec & (2**64 - 1), msg.stamp.nanosec, msg.epoch, msg.step,
                                         msg.capsule_id, msg.instance), msg.node.encode())


def record_mac(key: bytes, msg) -> str:
    """The MAC of a CapsuleRecord's fields and bytes (all but ``mac``)."""
    return _mac(key, RECORD_DOMAIN, _u64(msg.stamp.sec & (2**64 - 1), msg.stamp.nanosec, msg.seq, msg.epoch,
                                         msg.timeline, msg.kind, msg.capsule_id, msg.parent_id, msg.step),
                msg.fingerprint.encode(), memoryview(msg.record).cast("B"))


def valid(key: bytes | None, msg, mac_of) -> bool:
    """No key: True (nothing to check). With one: ``msg.mac`` is the MAC ``mac_of(key, msg)``."""
    return key is None or hmac.compare_digest(str(msg.mac).encode(), mac_of(key, msg).encode())
