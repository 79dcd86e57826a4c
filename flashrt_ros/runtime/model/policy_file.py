"""The policy file: safetensors tensors plus metadata that says what they mean.

Metadata (safetensors ``__metadata__``, strings only):

  format          "flashrt-policy"
  format_version  "1"
  architecture    JSON: every PolicyConfig field that changes what the tensors mean (ARCH_FIELDS)
  matrix_layout   "in_out": a matrix is [in, out] and a layer computes x @ w (torch.nn.Linear.weight.T)
  obs_names       JSON list of the observation channels' names ([] when unknown)
  action_names    JSON list of the action channels' names ([] when unknown)

A file's architecture is checked against the configured one (weights_path) or becomes it (policy_path).
A file without metadata (bare safetensors) still loads when every shape matches, with a warning, and its
missing ``action_scale`` / ``action_offset`` default to 1 and 0. f16 and bf16 tensors widen to float32
exactly; float64 is refused (narrowing rounds). The reader is this module's own (bounded, no pickle, no
mmap of a file that may change): safetensors' NumPy loader cannot read bf16.
"""
from __future__ import annotations

import json
import logging
import os
import stat
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .buffers import BufferSpec
from .config import PolicyConfig
from .weights import CONST_PREFIX, UNIT_DEFAULTS, WeightsError, check_weights

log = logging.getLogger("flashrt_ros.runtime")

FORMAT = "flashrt-policy"
FORMAT_VERSION = 1
MATRIX_LAYOUT = "in_out"
# The fields that change what the tensors mean; the rest (budgets, threads, noise, seed) are the host's.
ARCH_FIELDS = ("obs_dim", "action_dim", "d_model", "n_layers", "n_heads", "conv_kernel", "kv_window", "mixer",
               "chunk_len", "chunk_blend", "chunk_blend_decay")
MAX_HEADER_BYTES = 64 << 20  # a safetensors header is JSON: refuse one that would take the node's memory
_DTYPES = {"F32": ("<f4", 4), "F16": ("<f2", 2), "BF16": ("<u2", 2)}


@dataclass(frozen=True)
class PolicyFile:
    path: str
    tensors: dict[str, np.ndarray]  # float32, widened
    arch: dict[str, Any] | None  # None: a bare safetensors file
    obs_names: tuple[str, ...]
    action_names: tuple[str, ...]
    widened: tuple[str, ...]  # tensors stored at 16 bits


def _fail(path, msg: str) -> WeightsError:
    return WeightsError(f"{path}: {msg}")


def _read_regular_file(path: str | Path) -> bytes:
    """The file's bytes; a FIFO, device or directory is refused before a read could block."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise _fail(path, f"cannot open ({e.strerror})") from e
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise _fail(path, "not a regular file")
        with os.fdopen(fd, "rb", closefd=False) as f:
            return f.read()
    finally:
        os.close(fd)


def _decode(path, name: str, entry, data: memoryview) -> tuple[np.ndarray, bool]:
    if not isinstance(entry, dict):
        raise _fail(path, f"tensor {name}: malformed header entry")
    dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    if dtype == "F64":
        raise _fail(path, f"tensor {name}: float64; save float32 (narrowing would round), f16 or bf16")
    if dtype not in _DTYPES:
        raise _fail(path, f"tensor {name}: dtype {dtype!r} is not a float (F32, F16, BF16)")
    if (not isinstance(shape, list) or not all(type(d) is int and 0 <= d < 2**31 for d in shape)
            or not isinstance(offsets, list) or len(offsets) != 2 or not all(type(o) is int for o in offsets)):
        raise _fail(path, f"tensor {name}: malformed shape or data_offsets")
    np_dtype, size = _DTYPES[dtype]
    start, end = offsets
    if not 0 <= start <= end <= len(data) or end - start != int(np.prod(shape, dtype=np.int64)) * size:
        raise _fail(path, f"tensor {name}: data_offsets {offsets} do not fit its shape {shape} and the file")
    raw = np.frombuffer(data[start:end], np_dtype).reshape(shape)
    if dtype == "BF16":  # bf16 is float32's upper half: shifting back is exact
        return (raw.astype(np.uint32) << 16).view(np.float32), True
    return raw.astype(np.float32), dtype == "F16"  # f16 -> f32 is exact


def read_policy(path: str | Path) -> PolicyFile:
    """Every tensor (float32) and the metadata; WeightsError naming the file, and the tensor where one is at fault."""
    buf = _read_regular_file(path)
    if len(buf) < 8:
        raise _fail(path, "not a safetensors file (shorter than its 8-byte header length)")
    (n,) = struct.unpack("<Q", buf[:8])
    if n > min(len(buf) - 8, MAX_HEADER_BYTES):
        raise _fail(path, f"not a safetensors file (header length {n} past the file's {len(buf)} bytes)")
    try:
        header = json.loads(bytes(buf[8:8 + n]))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise _fail(path, f"not a safetensors file (header is not JSON: {e})") from e
    if not isinstance(header, dict):
        raise _fail(path, "not a safetensors file (header is not a JSON object)")
    meta = header.pop("__metadata__", None) or {}
    if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
        raise _fail(path, "__metadata__ must map names to strings")
    data = memoryview(buf)[8 + n:]
    tensors, widened = {}, []
    for name, entry in header.items():
        tensors[name], wide = _decode(path, name, entry, data)
        if wide:
            widened.append(name)
    arch, obs_names, action_names = _read_metadata(path, meta)
    return PolicyFile(str(path), tensors, arch, obs_names, action_names, tuple(widened))


def _json_field(path, meta: dict, key: str, kind: type):
    try:
        v = json.loads(meta[key])
    except (json.JSONDecodeError, RecursionError) as e:
        raise _fail(path, f"metadata {key}: not JSON ({e})") from e
    if not isinstance(v, kind):
        raise _fail(path, f"metadata {key}: expected a JSON {kind.__name__}")
    return v


def _read_metadata(path, meta: dict) -> tuple[dict | None, tuple[str, ...], tuple[str, ...]]:
    if meta.get("format") != FORMAT:
        return None, (), ()  # bare safetensors (or another tool's metadata): shapes are all we can check
    version = meta.get("format_version", "")
    if version != str(FORMAT_VERSION):
        raise _fail(path, f"policy format_version {version!r}; this flashrt_ros reads {FORMAT_VERSION}")
    layout = meta.get("matrix_layout", MATRIX_LAYOUT)
    if layout != MATRIX_LAYOUT:
        raise _fail(path, f"matrix_layout {layout!r}; expected {MATRIX_LAYOUT!r} ([in, out], x @ w: transpose "
                          "torch.nn.Linear weights)")
    if "architecture" not in meta:
        raise _fail(path, "a flashrt-policy file without its architecture metadata")
    arch = _json_field(path, meta, "architecture", dict)
    missing, unknown = sorted(set(ARCH_FIELDS) - set(arch)), sorted(set(arch) - set(ARCH_FIELDS))
    if missing or unknown:
        raise _fail(path, f"architecture: missing {missing}, unknown {unknown}")
    names = []
    for key in ("obs_names", "action_names"):
        v = _json_field(path, meta, key, list) if key in meta else []
        if not all(isinstance(s, str) for s in v):
            raise _fail(path, f"metadata {key}: expected a list of strings")
        names.append(tuple(v))
    for key, dim in (("obs_names", "obs_dim"), ("action_names", "action_dim")):
        got = names[key == "action_names"]
        if got and len(got) != arch[dim]:
            raise _fail(path, f"metadata {key}: {len(got)} names for {dim} {arch[dim]}")
    return arch, names[0], names[1]


def architecture(cfg: PolicyConfig) -> dict[str, Any]:
    return {f: getattr(cfg, f) for f in ARCH_FIELDS}


def save_policy(path: str | Path, cfg: PolicyConfig, weights: dict[str, np.ndarray], obs_names=(),
                action_names=()) -> None:
    """A policy file: the weights (float32, checked against cfg's weight table) and the metadata above. The same
    weights and config give the same bytes (safetensors' own writer orders the metadata differently each call)."""
    from .policy import HybridPolicy

    tensors = check_weights(dict(weights), HybridPolicy(cfg).weight_specs(), f"save_policy {path}")
    for key, names, dim in (("obs_names", obs_names, cfg.obs_dim), ("action_names", action_names, cfg.action_dim)):
        if names and len(names) != dim:
            raise ValueError(f"save_policy {path}: {len(names)} {key} for {dim} channels")
    meta = {"format": FORMAT, "format_version": str(FORMAT_VERSION), "matrix_layout": MATRIX_LAYOUT,
            "architecture": json.dumps(architecture(cfg), sort_keys=True),
            "obs_names": json.dumps(list(obs_names)), "action_names": json.dumps(list(action_names))}
    _write_safetensors(path, {k: v for k, v in tensors.items() if not k.startswith(CONST_PREFIX)}, meta)


def _write_safetensors(path: str | Path, tensors: dict[str, np.ndarray], meta: dict[str, str]) -> None:
    """safetensors, deterministic: tensors in name order, the header's keys sorted, padded with spaces to 8 bytes."""
    arrays = {k: np.ascontiguousarray(tensors[k], np.float32) for k in sorted(tensors)}
    header, at = {"__metadata__": meta}, 0
    for name, a in arrays.items():
        header[name] = {"dtype": "F32", "shape": list(a.shape), "data_offsets": [at, at + a.nbytes]}
        at += a.nbytes
    text = json.dumps(header, sort_keys=True, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for a in arrays.values():
            f.write(a.tobytes())


def check_architecture(pf: PolicyFile, cfg: PolicyConfig, where: str) -> None:
    """Refuse a file made for another architecture, naming the first field that differs."""
    for f in ARCH_FIELDS:
        if pf.arch[f] != getattr(cfg, f):
            raise WeightsError(f"{where}: architecture mismatch: {f} is {pf.arch[f]!r} in the file, "
                               f"{getattr(cfg, f)!r} in the config")


def load_policy_weights(path: str | Path, cfg: PolicyConfig, specs: list[BufferSpec], where: str = "") -> dict:
    """The weights of a policy file for cfg: architecture checked (warned about for a bare file), then every
    tensor's name, shape and finiteness (weights.check_weights)."""
    where = where or str(path)
    pf = read_policy(path)
    tensors = dict(pf.tensors)
    if pf.arch is None:
        log.warning("%s: no flashrt-policy metadata, so its architecture could not be checked (only its "
                    "shapes); save it with flashrt_ros.runtime.model.policy_file.save_policy", where)
        for name, value in UNIT_DEFAULTS.items():
            if name not in tensors:
                tensors[name] = np.full((cfg.action_dim,), value, np.float32)
    else:
        check_architecture(pf, cfg, where)
    if pf.widened:
        log.info("%s: %d tensors widened from 16 bits to float32 (exact)", where, len(pf.widened))
    return check_weights(tensors, specs, where)


def config_from_policy(path: str | Path, base: PolicyConfig | None = None) -> PolicyConfig:
    """``base`` (default: the defaults) with the file's architecture, loading its weights (policy_path)."""
    return resolve_policy_config((base or PolicyConfig()).replace(policy_path=str(path), weights_path=""))


def resolve_policy_config(cfg: PolicyConfig) -> PolicyConfig:
    """cfg with policy_path's architecture in place of its own (cfg unchanged without policy_path).

    An architecture field the config sets to neither its default nor the file's value is a conflict, refused
    naming the field (a params file saying d_model 256 beside a 128-wide policy is a mistake, not a wish)."""
    if not cfg.policy_path:
        return cfg
    pf = read_policy(cfg.policy_path)
    if pf.arch is None:
        raise WeightsError(f"policy_path {cfg.policy_path}: no flashrt-policy metadata, so no architecture to "
                           "take; give it as weights_path with the architecture in the config")
    defaults = PolicyConfig()
    for f in ARCH_FIELDS:
        mine = getattr(cfg, f)
        if mine != pf.arch[f] and mine != getattr(defaults, f):
            raise WeightsError(f"policy_path {cfg.policy_path}: {f} is {pf.arch[f]!r} in the file and {mine!r} in "
                               "the config; drop it from the config (the file is the architecture)")
    try:
        return cfg.replace(**pf.arch)
    except (TypeError, ValueError) as e:
        raise WeightsError(f"policy_path {cfg.policy_path}: architecture: {e}") from e
