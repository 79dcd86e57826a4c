"""The ROS-free runtime: importable and testable with NumPy alone."""
from .capsule import CapsuleInfo, CapsuleStore, StoreUsage
from .config import PolicyConfig
from .errors import CapsuleError, CapsuleInUse, CorruptCapsule, FingerprintMismatch, StoreFullOfPins, UnknownCapsule
from .session import ReplanResult, Session, StepResult

__all__ = ["CapsuleError", "CapsuleInUse", "CapsuleInfo", "CapsuleStore", "CorruptCapsule", "FingerprintMismatch",
           "PolicyConfig", "ReplanResult", "Session", "StepResult", "StoreFullOfPins", "StoreUsage", "UnknownCapsule"]
