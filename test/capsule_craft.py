"""Crafted capsule files for hostile-input tests: a valid export, altered, then re-checksummed the way
the runtime checksums (metadata and state), so only the runtime's validation can refuse it."""
from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np

from flashrt_ros.runtime.model.kernels import META_KV_LEN
from flashrt_ros.runtime.state import capsule_file


def read_capsule(path: Path) -> tuple[dict, dict]:
    from safetensors.numpy import load
    raw = Path(path).read_bytes()
    header = json.loads(raw[8:8 + struct.unpack("<Q", raw[:8])[0]])
    return dict(header["__metadata__"]), load(raw)


def craft(src: Path, dst: Path, info: dict | None = None, info_text: str | None = None, alter=None) -> Path:
    """Copy of `src` with info fields replaced (`info`), the info JSON replaced (`info_text`), or the
    tensors changed in place (`alter(tensors)`), with a matching checksum."""
    from safetensors.numpy import save
    meta, tensors = read_capsule(src)
    if alter is not None:
        alter(tensors)
    fields = json.loads(meta["info"])
    fields.update(info or {})
    meta["info"] = info_text if info_text is not None else json.dumps(fields, sort_keys=True)
    meta["state_sha256"] = capsule_file.state_digest(tensors)
    checked = {k: meta[k] for k in ("format", "info", "fingerprint", "state_sha256")}
    meta["sha256"] = capsule_file._digest(checked, tensors)
    Path(dst).write_bytes(save(tensors, metadata=meta))
    return Path(dst)


def _set_kv_len(tensors, value: int) -> None:
    tensors["meta"][..., META_KV_LEN] = value


def _nan_state(tensors) -> None:
    name = next(n for n, t in sorted(tensors.items()) if t.dtype.kind == "f" and n != "meta")
    tensors[name].reshape(-1)[0] = np.nan


# name -> craft() keyword arguments; each must be refused at import
HOSTILE = {
    "info_is_a_list": dict(info_text="[1, 2]"),
    "step_null": dict(info={"step": None}),
    "step_negative": dict(info={"step": -1}),
    "step_string": dict(info={"step": "abc"}),
    "stamp_1e30": dict(info={"stamp_ns": 1e30}),
    "label_too_long": dict(info={"label": "x" * 300}),
    "meta_kv_len_negative": dict(alter=lambda t: _set_kv_len(t, -1)),
    "nan_state": dict(alter=_nan_state),
}
