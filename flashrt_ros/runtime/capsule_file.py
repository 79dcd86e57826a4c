"""The capsule file: a self-contained safetensors file of one materialised state row.

One tensor per state buffer (the KV window gathered into ``[kv_window, d_model]``, slot =
position % kv_window), plus string metadata: the format version, the CapsuleInfo as JSON, the
fingerprint, and a sha256 over the metadata *and* the tensor bytes. Reading validates the size,
the header, the fingerprint, the checksum, every info field and the ``meta`` invariants, and checks
the state for finiteness, before anything is handed to the store.
"""
from __future__ import annotations

import hashlib
import json
import os
import stat
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .errors import CorruptCapsule, FingerprintMismatch
from .kernels import META_KV_LEN, META_LEN, META_POS, META_RNG, META_STEP

FORMAT = "flashrt-capsule/2"
OLD_FORMATS = {"flashrt-capsule/1": "written by flashrt_ros 0.1 (full-row store, no metadata checksum)"}
MAX_HEADER_BYTES = 1 << 20  # the JSON header of a capsule is a few KiB
MAX_LABEL_CHARS = 256
INT64_MAX = 2**63 - 1


@dataclass(frozen=True)
class CapsulePayload:
    """A capsule copied to the host: what an export writes and an import returns once validated."""
    tensors: dict[str, np.ndarray]  # state buffer name -> array of its spec's shape and dtype
    info: dict  # CapsuleInfo fields


def state_digest(tensors: dict[str, np.ndarray]) -> str:
    """sha256 of the state alone: equal states give equal digests, whatever their ids and labels."""
    return _digest(None, tensors)


def _digest(meta_fields: dict[str, str] | None, tensors: dict[str, np.ndarray]) -> str:
    h = hashlib.sha256()
    if meta_fields is not None:
        h.update(json.dumps(meta_fields, sort_keys=True).encode())
    for name in sorted(tensors):
        h.update(name.encode())
        h.update(np.ascontiguousarray(tensors[name]).tobytes())
    return h.hexdigest()


def write_capsule_file(payload: CapsulePayload, path: str | Path) -> str:
    """Crash-safe write: a temporary name, fsync, rename, fsync of the directory. A failure leaves
    neither a partial file under ``path`` nor the temporary. Returns the state's sha256 (state_digest);
    the file's own checksum covers the metadata as well."""
    from safetensors.numpy import save  # optional dependency: imported where it is needed

    path = Path(path)
    meta = {"format": FORMAT, "info": json.dumps(payload.info, sort_keys=True),
            "fingerprint": str(payload.info["fingerprint"]), "state_sha256": state_digest(payload.tensors)}
    digest = _digest(meta, payload.tensors)
    blob = save({k: np.ascontiguousarray(v) for k, v in payload.tensors.items()}, metadata={**meta, "sha256": digest})
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            view = memoryview(blob)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    dfd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)
    return meta["state_sha256"]


def _read_bounded(path: Path, max_bytes: int) -> bytes:
    """The whole file, refusing non-regular files (a FIFO would block) and anything too large."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except FileNotFoundError:
        raise CorruptCapsule(f"{path}: no such file") from None
    except OSError as e:
        raise CorruptCapsule(f"{path}: cannot open ({e.strerror})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise CorruptCapsule(f"{path}: not a regular file")
        if st.st_size > max_bytes:
            raise CorruptCapsule(f"{path}: {st.st_size} bytes, larger than a capsule of this policy "
                                 f"can be ({max_bytes})")
        if st.st_size < 8:
            raise CorruptCapsule(f"{path}: too short to be a safetensors file ({st.st_size} bytes)")
        head = os.read(fd, 8)
        (header_len,) = struct.unpack("<Q", head)
        if header_len > MAX_HEADER_BYTES or header_len > st.st_size - 8:
            raise CorruptCapsule(f"{path}: header length {header_len} is out of range")
        chunks, left = [head], st.st_size - 8
        while left > 0:
            b = os.read(fd, min(left, 1 << 22))
            if not b:
                break
            chunks.append(b)
            left -= len(b)
        return b"".join(chunks)
    finally:
        os.close(fd)


def _int_field(info: dict, name: str, lo: int, hi: int = INT64_MAX) -> int:
    v = info.get(name)
    if not isinstance(v, int) or isinstance(v, bool) or not lo <= v <= hi:
        raise ValueError(f"info.{name} must be an integer in [{lo}, {hi}], got {v!r}")
    return v


def validate_info(info) -> dict:
    if not isinstance(info, dict):
        raise ValueError(f"info must be a JSON object, got {type(info).__name__}")
    out = {"id": _int_field(info, "id", 0), "parent_id": _int_field(info, "parent_id", 0),
           "step": _int_field(info, "step", 0), "stamp_ns": _int_field(info, "stamp_ns", 0)}
    label = info.get("label", "")
    if not isinstance(label, str) or len(label) > MAX_LABEL_CHARS:
        raise ValueError(f"info.label must be a string of at most {MAX_LABEL_CHARS} characters")
    out["label"] = label
    return out


def check_meta(meta: np.ndarray, step: int, kv_window: int) -> None:
    """The invariants every reachable ``meta`` row satisfies (they all count from 0 in lockstep).
    A capsule that breaks them was not written by this runtime and could index outside a buffer."""
    m = [int(x) for x in meta]
    if len(m) != META_LEN:
        raise ValueError(f"meta has {len(m)} fields, expected {META_LEN}")
    pos, kv_len = m[META_POS], m[META_KV_LEN]
    if pos < 0 or pos > INT64_MAX // 2:
        raise ValueError(f"meta position {pos} is out of range")
    if kv_len != min(pos, kv_window):
        raise ValueError(f"meta kv_len {kv_len} must be min(position {pos}, kv_window {kv_window})")
    if m[META_STEP] != pos or m[META_RNG] != pos:
        raise ValueError(f"meta step {m[META_STEP]} and rng_counter {m[META_RNG]} must equal position {pos}")
    if step != pos:
        raise ValueError(f"info.step {step} does not match meta step {pos}")
    if any(m[META_RNG + 1:]):
        raise ValueError("meta's reserved fields must be zero")


def read_capsule_file(path: str | Path, specs, fingerprint: str, kv_window: int) -> CapsulePayload:
    """Validate a capsule file completely; touches nothing. ``specs``: the state BufferSpecs of the
    materialised row, in table order."""
    from safetensors import SafetensorError
    from safetensors.numpy import load

    path = Path(path)
    data_bytes = sum(s.nbytes for s in specs)
    raw = _read_bounded(path, 8 + MAX_HEADER_BYTES + data_bytes)
    try:
        header = json.loads(raw[8:8 + struct.unpack("<Q", raw[:8])[0]])
        meta = header.get("__metadata__") or {}
    except (ValueError, AttributeError) as e:
        raise CorruptCapsule(f"{path}: unreadable safetensors header ({e})") from None
    fmt = meta.get("format")
    if fmt in OLD_FORMATS:
        raise CorruptCapsule(f"{path}: capsule format {fmt} ({OLD_FORMATS[fmt]}) is not supported; this "
                             f"runtime reads {FORMAT}: re-export the capsule with a current node")
    if fmt != FORMAT:
        raise CorruptCapsule(f"{path}: not a flashrt capsule (format {fmt!r}, expected {FORMAT})")
    if meta.get("fingerprint") != fingerprint:
        raise FingerprintMismatch(f"{path}: fingerprint {str(meta.get('fingerprint'))[:12]} does not match "
                                  f"this policy's {fingerprint[:12]} (other config, weights or plan)")
    try:
        tensors = load(raw)
    except (SafetensorError, ValueError, RuntimeError) as e:
        raise CorruptCapsule(f"{path}: not a readable safetensors file ({e})") from None
    names = [s.name for s in specs]
    if set(tensors) != set(names):
        raise CorruptCapsule(f"{path}: buffers {sorted(set(tensors) ^ set(names))[:4]} do not match the state table")
    for s in specs:
        t = tensors[s.name]
        if t.shape != s.shape or t.dtype != np.dtype(s.dtype):
            raise CorruptCapsule(f"{path}: {s.name} is {t.dtype}{list(t.shape)}, expected {s.dtype}{list(s.shape)}")
    fields = {k: meta.get(k) for k in ("format", "info", "fingerprint", "state_sha256")}
    if meta.get("sha256") != _digest(fields, tensors):
        raise CorruptCapsule(f"{path}: checksum mismatch: the state or the metadata were altered")
    try:
        info = validate_info(json.loads(meta["info"]))
        check_meta(tensors["meta"], info["step"], kv_window)
    except (KeyError, ValueError, TypeError) as e:
        raise CorruptCapsule(f"{path}: bad metadata: {e}") from None
    for s in specs:
        t = tensors[s.name]
        if t.dtype.kind == "f" and not np.isfinite(t).all():
            raise CorruptCapsule(f"{path}: {s.name} holds non-finite values")
    return CapsulePayload(tensors, info)
