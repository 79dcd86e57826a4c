"""Weights: seeded init, every name/shape/dtype checked, save, fingerprint (files: policy_file.py)."""
from __future__ import annotations

import dataclasses
import hashlib
import json

import numpy as np

from .buffers import BufferSpec
from .config import PolicyConfig

CONST_PREFIX = "const."  # constants live beside weights but are never loaded or saved
# Fields that do not change what a state row means (config.py marks them)
_FINGERPRINT_EXCLUDE = {f.name for f in dataclasses.fields(PolicyConfig) if not f.metadata.get("fingerprint", True)}


UNIT_DEFAULTS = {"action_scale": 1.0, "action_offset": 0.0}  # action = blend * scale + offset


class WeightsError(ValueError):
    pass


def bf16_values(w: np.ndarray) -> np.ndarray:
    """float32 w rounded to the nearest bf16 value (ties to even), still float32: its low 16 bits zero. NaN stays
    as it is (its rounded bits could read as inf or zero)."""
    f = np.ascontiguousarray(w, np.float32)
    bits = f.view(np.uint32).astype(np.uint64)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16 << 16
    return np.where(np.isnan(f), f, bits.astype(np.uint32).view(np.float32)).reshape(np.shape(w))


def seeded_weights(specs: list[BufferSpec], seed: int) -> dict[str, np.ndarray]:
    """Deterministic random weights: each tensor from its own stream, keyed by (seed, name). The values are bf16
    values held in float32, as a policy trained in bf16 exports them: every backend computes with these exact
    values, and the compiled CPU step reads its matrices at 16 bits (cpu_panels.py)."""
    out = {}
    for s in specs:
        name = s.name
        if name.startswith(CONST_PREFIX):
            out[name] = np.ones(s.shape, s.dtype)
            continue
        key = int.from_bytes(hashlib.sha256(f"{seed}:{name}".encode()).digest()[:8], "little")
        rng = np.random.default_rng(key)
        if name in UNIT_DEFAULTS:  # the robot's units: identity unless a policy file says otherwise
            w = np.full(s.shape, UNIT_DEFAULTS[name])
        elif name == "obs_mean" or name.endswith((".b", ".b1", ".b2", "b_ih", "b_hh")):
            w = rng.standard_normal(s.shape) * 0.02
        elif name == "obs_inv_std" or name.endswith(".g"):
            w = np.ones(s.shape)
        else:  # [fan_in, fan_out]; conv.w is [taps, d]
            w = rng.standard_normal(s.shape) / np.sqrt(s.shape[0])
        out[name] = bf16_values(w) if np.dtype(s.dtype) == np.float32 else w.astype(s.dtype)
    return out


def check_weights(tensors: dict, specs: list[BufferSpec], where: str) -> dict[str, np.ndarray]:
    """Every weight the specs name, of its shape and dtype and finite, nothing else (the constants are made
    here, and taken if given: a session's own weights hold them); WeightsError naming ``where`` otherwise."""
    want = {s.name: s for s in specs if not s.name.startswith(CONST_PREFIX)}
    missing = sorted(set(want) - set(tensors))
    extra = sorted(n for n in set(tensors) - set(want) if not str(n).startswith(CONST_PREFIX))
    if missing or extra:
        raise WeightsError(f"{where}: missing {missing[:5]}, unexpected {extra[:5]}")
    for name, s in want.items():
        t = tensors[name]
        if not isinstance(t, np.ndarray) or t.shape != s.shape or t.dtype != np.dtype(s.dtype):
            got = f"{t.dtype}{list(t.shape)}" if isinstance(t, np.ndarray) else type(t).__name__
            raise WeightsError(f"{where}: {name} is {got}, expected {s.dtype}{list(s.shape)}")
        if not np.isfinite(t).all():
            raise WeightsError(f"{where}: {name} has non-finite values")
    out = {n: np.ascontiguousarray(tensors[n]) for n in want}
    out.update({s.name: np.ones(s.shape, s.dtype) for s in specs if s.name.startswith(CONST_PREFIX)})
    return out


def fingerprint(cfg: PolicyConfig, weights: dict[str, np.ndarray], plan_text: str, layout_text: str) -> str:
    """sha256 over what gives a state row its meaning: config, weights, plan and slab layout."""
    h = hashlib.sha256()
    cfg_items = {k: v for k, v in cfg.to_dict().items() if k not in _FINGERPRINT_EXCLUDE}
    h.update(json.dumps(cfg_items, sort_keys=True).encode())
    for name in sorted(weights):
        h.update(name.encode())
        h.update(np.ascontiguousarray(weights[name]).tobytes())
    h.update(plan_text.encode())
    h.update(layout_text.encode())
    return h.hexdigest()
