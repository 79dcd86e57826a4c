"""The ROS-free runtime: importable and testable with NumPy alone."""
from .errors import CapsuleError, CapsuleInUse, CorruptCapsule, FingerprintMismatch, StoreFullOfPins, UnknownCapsule
from .model.config import PolicyConfig
from .session import ReplanResult, Session, StepResult
from .state.capsule_store import CapsuleInfo, CapsuleStore, StoreUsage

__all__ = ["CapsuleError", "CapsuleInUse", "CapsuleInfo", "CapsuleStore", "CorruptCapsule", "FingerprintMismatch",
           "PolicyConfig", "ReplanResult", "Session", "StepResult", "StoreFullOfPins", "StoreUsage", "UnknownCapsule"]
