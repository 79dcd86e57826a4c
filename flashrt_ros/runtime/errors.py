"""Runtime errors. Every one leaves the live state untouched when it is raised."""
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


class UnauthenticatedCapsule(CorruptCapsule):
    """A capsule file without the HMAC of this node's key (capsule_hmac_key_file), or with a wrong one."""


class StoreFullOfPins(CapsuleError):
    """A pin was refused: keeping it could leave the live step (or a replan) without room."""


class CapsuleInUse(CapsuleError):
    """The operation would remove a capsule that the live state depends on."""


class NonFiniteAction(CapsuleError):
    """A step (or the branch a replan would commit) produced a non-finite action and was refused: nothing
    was published or committed, the live state is as before. The state itself is bad (a forged capsule?)."""
