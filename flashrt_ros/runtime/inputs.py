"""Validation of what callers hand the runtime (observations, labels): a ValueError that names the problem,
raised before anything is touched."""
from __future__ import annotations

import numbers

import numpy as np

from .state.capsule_file import MAX_STAMP_NS

MAX_LABEL_CHARS = 256  # a label is a name, not a payload: bounds what one request can make the node keep


def as_observations(obs, shape: tuple[int, ...], what: str = "observation") -> np.ndarray:
    """Validate shape, dtype and finiteness; returns float32. Raises ValueError, touching nothing.

    Finiteness is checked after the cast: 1e300 is finite in float64 and inf in float32."""
    a = np.asarray(obs)
    if a.dtype.kind != "f":
        raise ValueError(f"{what}: dtype must be floating point, got {a.dtype}")
    if a.shape != shape:
        raise ValueError(f"{what}: expected shape {shape}, got {a.shape}")
    with np.errstate(over="ignore"):
        f = np.ascontiguousarray(a, dtype=np.float32)
    bad = ~np.isfinite(f)
    if bad.any():
        idx = tuple(int(i) for i in np.argwhere(bad)[0])
        raise ValueError(f"{what}: non-finite value {a[idx]} at index {idx if len(idx) > 1 else idx[0]} "
                         "(as float32)")
    return f


def check_label(label: str) -> str:
    if not isinstance(label, str):
        raise ValueError(f"label: expected a string, got {type(label).__name__}")
    if len(label) > MAX_LABEL_CHARS:
        raise ValueError(f"label: at most {MAX_LABEL_CHARS} characters, got {len(label)}")
    return label


def check_int(name: str, value, lo: int = 0, none_ok: bool = False, hi: int | None = None) -> int | None:
    """value as an int in [lo, hi] (None passes where none_ok); a bool, a float or a string is refused, naming
    the argument, rather than rounded, taken as 1, or failing deeper in with a TypeError."""
    if value is None and none_ok:
        return None
    if type(value) is not int and (isinstance(value, bool) or not isinstance(value, numbers.Integral)):
        raise ValueError(f"{name}: expected an integer, got {value!r}")
    if value < lo:
        raise ValueError(f"{name}: must be >= {lo}, got {value}")
    if hi is not None and value > hi:
        raise ValueError(f"{name}: must be <= {hi}, got {value}")
    return int(value)


def check_stamp_ns(stamp_ns) -> int:
    """A capsule's stamp: a ROS Time from 1970 on (every stamp goes out in one: list_capsules, the stream)."""
    return check_int("stamp_ns", stamp_ns, 0, hi=MAX_STAMP_NS)


def check_real(name: str, value, none_ok: bool = False) -> float | None:
    """value as a float (None passes where none_ok); a bool or a string is refused, naming the argument."""
    if value is None and none_ok:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name}: expected a number, got {value!r}")
    return float(value)
