"""The ROS-free runtime: importable and testable with NumPy alone."""
from .capsule import (
                      CapsuleError,
                      CapsuleInfo,
                      CapsuleStore,
                      CorruptCapsule,
                      FingerprintMismatch,
                      StoreFullOfPins,
                      UnknownCapsule,
)
from .config import PolicyConfig
from .session import ReplanResult, Session, StepResult

__all__ = ["CapsuleError", "CapsuleInfo", "CapsuleStore", "CorruptCapsule", "FingerprintMismatch",
           "PolicyConfig", "ReplanResult", "Session", "StepResult", "StoreFullOfPins", "UnknownCapsule"]
