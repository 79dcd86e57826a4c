"""Capsule errors. Every one leaves the live state untouched when it is raised."""
from __future__ import annotations


class CapsuleError(Exception):
    """Base of every capsule failure."""


class UnknownCapsule(CapsuleError, KeyError):
    def __str__(self):  # KeyError would quote the message
        return str(self.args[0])


class FingerprintMismatch(CapsuleError):
    pass


class CorruptCapsule(CapsuleError):
    pass


class StoreFullOfPins(CapsuleError):
    """A pin was refused: keeping it could leave the live step (or a replan) without room."""


class CapsuleInUse(CapsuleError):
    """The operation would remove a capsule that the live state depends on."""
