"""The capsule file: a self-contained safetensors file of one materialised state row.

One tensor per state buffer (the KV window gathered into ``[kv_window, d_model]``, slot =
position % kv_window), plus string metadata: the format version, the CapsuleInfo as JSON, the
fingerprint, and a sha256 over the metadata *and* the tensor bytes. Reading validates the size,
the header, the fingerprint, the checksum, every info field and the ``meta`` invariants, and checks
the state against what the model can produce (finite, and state/bounds.py), before anything is handed
to the store.

Anyone can recompute a sha256. With a key (the node's ``capsule_hmac_key_file``) a file also carries an
HMAC-SHA256 of its checksum, and a reader holding the key refuses a file without it or with a wrong one.
"""
from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import os
import re
import stat
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import CorruptCapsule, FingerprintMismatch, UnauthenticatedCapsule
from ..model.kernels import META_KV_LEN, META_LEN, META_POS, META_RNG, META_STEP

FORMAT = "flashrt-capsule/2"
OLD_FORMATS = {"flashrt-capsule/1": "written by flashrt_ros 0.1 (full-row store, no metadata checksum)"}
MAX_HEADER_BYTES = 1 << 20  # the JSON header of a capsule is a few KiB
MAX_LABEL_CHARS = 256
INT64_MAX = 2**63 - 1
# the latest stamp a ROS builtin_interfaces/Time holds (int32 seconds): every capsule's stamp goes out in one
# (list_capsules, the stream), so a later one, from a file, a record or a caller, is refused on arrival
MAX_STAMP_NS = (2**31 - 1) * 1_000_000_000 + 999_999_999

MIN_KEY_BYTES = 16
MAC_DOMAIN = b"flashrt-capsule-hmac\0"  # the MAC of a capsule's checksum is never valid for anything else
TEMP_NAME = re.compile(r"^\.(.+)\.(\d+)\.tmp$")  # write_capsule_file's temporary: .<name>.<pid>.tmp


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


def _mac(key: bytes, digest: str) -> str:
    """HMAC-SHA256 of the file's sha256 (which covers the metadata and every tensor byte)."""
    return hmac.new(key, MAC_DOMAIN + digest.encode(), hashlib.sha256).hexdigest()


def load_hmac_key(path: str | Path) -> bytes:
    """The key in ``path`` (capsule_hmac_key_file): a regular file only its owner can read or write, at
    least 16 bytes (surrounding whitespace ignored, so ``openssl rand -hex 32 > key`` works)."""
    path = Path(path).expanduser()
    what = f"capsule_hmac_key_file {path}"
    with _regular_file(path, ValueError, what, os.O_NOFOLLOW) as (fd, st):
        if st.st_uid != os.geteuid() or st.st_mode & 0o077:
            raise ValueError(f"{what}: must be owned by this user and readable by nobody else (mode "
                             f"{stat.S_IMODE(st.st_mode):o}; chmod 600 it)")
        key = os.read(fd, 4096).strip()
    if len(key) < MIN_KEY_BYTES:
        raise ValueError(f"capsule_hmac_key_file {path}: {len(key)} bytes of key, at least {MIN_KEY_BYTES} are "
                         "needed (e.g. openssl rand -hex 32)")
    return key


def check_capsule_path(path: str | Path) -> Path:
    """A path a capsule file can be written under as given: no NUL (the OS would cut the name there)."""
    text = os.fspath(path)
    if "\x00" in text:
        raise ValueError(f"capsule file name {text!r} contains a NUL character: refused (the name would be cut "
                         "short there)")
    return Path(text)


def sweep_stale_temporaries(directory: str | Path) -> list[Path]:
    """Remove the temporaries of exports whose process is gone (a kill mid-write leaves
    ``.<name>.<pid>.tmp``); those of live processes stay. Returns what was removed."""
    removed = []
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return removed
    for entry in entries:
        m = TEMP_NAME.match(entry.name)
        if m is None or not entry.is_file(follow_symlinks=False):
            continue
        pid = int(m.group(2))
        if pid != os.getpid() and _alive(pid):
            continue  # another process may be writing it now
        try:
            os.unlink(entry.path)
            removed.append(Path(entry.path))
        except OSError:
            pass
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except PermissionError:
        return True  # another user's process
    except (ProcessLookupError, OverflowError):
        return False  # gone, or a number no pid can be
    return True


def write_capsule_file(payload: CapsulePayload, path: str | Path, hmac_key: bytes | None = None) -> str:
    """Crash-safe write: a temporary name, fsync, rename, fsync of the directory. A failure leaves
    neither a partial file under ``path`` nor the temporary. Returns the state's sha256 (state_digest);
    the file's own checksum covers the metadata as well. ``hmac_key``: also write an HMAC of that checksum."""
    from safetensors.numpy import save  # optional dependency: imported where it is needed

    path = check_capsule_path(path)
    meta = {"format": FORMAT, "info": json.dumps(payload.info, sort_keys=True),
            "fingerprint": str(payload.info["fingerprint"]), "state_sha256": state_digest(payload.tensors)}
    digest = _digest(meta, payload.tensors)
    mac = {"hmac_sha256": _mac(hmac_key, digest)} if hmac_key else {}
    blob = save({k: np.ascontiguousarray(v) for k, v in payload.tensors.items()},
                metadata={**meta, "sha256": digest, **mac})
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
    with _regular_file(path, CorruptCapsule, str(path)) as (fd, st):
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


@contextlib.contextmanager
def _regular_file(path: Path, error: type[Exception], what: str, flags: int = 0):
    """(fd, stat) of ``path`` opened without blocking (a FIFO would), closed after; ``error`` naming ``what``
    when it cannot be opened or is not a regular file."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | flags)
    except FileNotFoundError:
        raise error(f"{what}: cannot open (no such file)") from None
    except OSError as e:
        raise error(f"{what}: cannot open ({e.strerror})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise error(f"{what}: not a regular file")
        yield fd, st
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
           "step": _int_field(info, "step", 0), "stamp_ns": _int_field(info, "stamp_ns", 0, MAX_STAMP_NS)}
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


def read_capsule_file(path: str | Path, specs, fingerprint: str, kv_window: int, bounds=None,
                      hmac_key: bytes | None = None) -> CapsulePayload:
    """Validate a capsule file completely; touches nothing. ``specs``: the state BufferSpecs of the
    materialised row, in table order. ``bounds``: a state_bounds.StateBounds the state must keep.
    ``hmac_key``: the file must carry the HMAC of this key."""
    from safetensors import SafetensorError
    from safetensors.numpy import load

    path = check_capsule_path(path)
    data_bytes = sum(s.nbytes for s in specs)
    raw = _read_bounded(path, 8 + MAX_HEADER_BYTES + data_bytes)
    try:
        header = json.loads(raw[8:8 + struct.unpack("<Q", raw[:8])[0]])
        meta = header.get("__metadata__") or {}
        if not isinstance(meta, dict):
            raise ValueError(f"__metadata__ is a {type(meta).__name__}, not a mapping")
    except (ValueError, AttributeError, RecursionError) as e:  # RecursionError: JSON nested past the stack
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
    if hmac_key and not isinstance(meta.get("hmac_sha256"), str):
        raise UnauthenticatedCapsule(f"{path}: no HMAC, and this node imports only files signed with its "
                                     "capsule_hmac_key_file: export it from a node with the same key")
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
    if hmac_key and not hmac.compare_digest(meta["hmac_sha256"].encode(), _mac(hmac_key, meta["sha256"]).encode()):
        raise UnauthenticatedCapsule(f"{path}: HMAC mismatch: signed with another key, or forged; refused "
                                     "(export it from a node with the same capsule_hmac_key_file)")
    try:
        info = validate_info(json.loads(meta["info"]))
        check_meta(tensors["meta"], info["step"], kv_window)
    except (KeyError, ValueError, TypeError) as e:
        raise CorruptCapsule(f"{path}: bad metadata: {e}") from None
    for s in specs:
        t = tensors[s.name]
        if t.dtype.kind == "f" and not np.isfinite(t).all():
            raise CorruptCapsule(f"{path}: {s.name} holds non-finite values")
    if bounds is not None:
        try:
            bounds.check(tensors)
        except ValueError as e:
            raise CorruptCapsule(f"{path}: {e}: refused (forged or from another policy)") from None
    return CapsulePayload(tensors, info)
