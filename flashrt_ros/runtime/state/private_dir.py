"""The rules for a directory the node writes state into and reads it back from (capsule_dir, persist_dir).

Whoever can write into such a directory can plant a file the node will read (a forged capsule or log
record) or a link it will write through. So the directory is created with mode 0700, and an existing one
must be a real directory owned by the node's user and writable by nobody else.
"""
from __future__ import annotations

import os
import stat
from pathlib import Path


def check_private_dir(path: Path, what: str, create: bool, error: type[Exception] = ValueError) -> Path:
    """``path`` checked (and made with mode 0700 when missing and ``create``); raises ``error`` naming
    ``what`` (the parameter) and what to do otherwise."""
    path = Path(path)
    if create and not os.path.lexists(path):
        try:
            path.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError as e:
            raise error(f"{what} {path}: cannot be created ({e.strerror or e})") from None
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        raise error(f"{what} {path} does not exist") from None
    if not stat.S_ISDIR(st.st_mode):
        raise error(f"{what} {path} is not a directory")
    if st.st_uid != os.geteuid():
        raise error(f"{what} {path} is owned by uid {st.st_uid}, not by this node's user ({os.geteuid()}): "
                    "refused (another user could plant files in it); use a directory of your own")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise error(f"{what} {path} is writable by group or others (mode {stat.S_IMODE(st.st_mode):04o}): "
                    f"refused (they could plant files in it); run chmod go-w {path}")
    return path


def overlapping(a: Path, b: Path) -> bool:
    """Whether one directory is the other or inside it (both resolved through links)."""
    a, b = Path(os.path.realpath(a)), Path(os.path.realpath(b))
    return a == b or a in b.parents or b in a.parents
