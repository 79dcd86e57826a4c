"""The compiled CPU step's on-disk cache, keyed by the source of every module compiled into it.

numba keys a cached function on its own file only, and run_program (cpu_kernels.py) compiles in
cpu_attention.py, cpu_program.py and kernel_spec.py's constants: an edit to one of those alone would keep
running the old machine code read from the cache. Importing this module, before any ``@njit`` of those
modules runs, points numba at ``<root>/<hash of those sources>``, so any edit gets a fresh directory.
Root: ``NUMBA_CACHE_DIR`` when set, else ``$XDG_CACHE_HOME/flashrt_ros/numba`` (``~/.cache/...``), the same
for every entry point (``make`` targets, the tests and the installed tools; ``make setup`` fills it).
Directories of older sources stay behind until removed by hand (a few MiB each).

numba runs the machine code its index files point at: a cache another local user can write is code they run
inside the node. So the cache is used only when the keyed directory, everything in it and the root are this
user's and writable by nobody else, and every directory above them is this user's or root's and writable by
nobody else unless sticky (/tmp). Otherwise the step compiles into a private temporary directory removed at
exit (no cache: 1-3 min at start), and REFUSED says why (logged once at import).
"""
from __future__ import annotations

import atexit
import hashlib
import logging
import os
import shutil
import stat
import tempfile
from pathlib import Path

import numba.core.config

_ENGINE = Path(__file__).resolve().parent
SOURCES = tuple(sorted(_ENGINE.glob("cpu_*.py"))) + (_ENGINE.parent / "model" / "kernel_spec.py",)


def source_key(sources=SOURCES) -> str:
    h = hashlib.sha256()
    for path in sources:
        h.update(path.name.encode() + b"\0" + path.read_bytes())
    return h.hexdigest()[:16]


def cache_root() -> Path:
    if os.environ.get("NUMBA_CACHE_DIR"):
        return Path(os.environ["NUMBA_CACHE_DIR"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "flashrt_ros" / "numba"


def _others_write(st: os.stat_result) -> str:
    """Who besides this user can write a file or directory with this stat ('' for nobody)."""
    if st.st_mode & stat.S_IWOTH:
        return "every user"
    if st.st_mode & stat.S_IWGRP:
        try:
            import grp
            import pwd
            group = grp.getgrgid(st.st_gid)
            me = pwd.getpwuid(os.getuid()).pw_name
            others = [m for m in group.gr_mem if m != me]
            others += [u.pw_name for u in pwd.getpwall() if u.pw_gid == st.st_gid and u.pw_uid != os.getuid()]
        except (ImportError, KeyError):
            return f"group {st.st_gid}"
        return f"group {group.gr_name} ({', '.join(sorted(set(others)))})" if others else ""
    return ""


def check_cache_dir(keyed: Path) -> str:
    """Why ``keyed`` (the cache directory of these sources, created 0700 if missing) must not be used: '' when
    it, its contents and its root are this user's and nobody else can write them or any directory above."""
    uid = os.getuid()
    try:
        keyed.mkdir(mode=0o700, parents=True, exist_ok=True)
        real = keyed.resolve(strict=True)
        for parent in real.parents:  # root's or ours, writable by nobody else unless sticky (/tmp)
            st = os.stat(parent)
            if st.st_uid not in (0, uid):
                return f"{parent} belongs to user {st.st_uid}"
            who = _others_write(st)
            if who and not st.st_mode & stat.S_ISVTX:
                return f"{parent} is writable by {who}"
        for top, dirs, files in os.walk(real):  # ours alone, to the last index file; no links
            for name in ["", *dirs, *files]:
                path = os.path.join(top, name) if name else top
                st = os.lstat(path)
                if stat.S_ISLNK(st.st_mode) or not (stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode)):
                    return f"{path} is not a plain file or directory"
                if st.st_uid != uid:
                    return f"{path} belongs to user {st.st_uid}, not {uid}"
                who = _others_write(st)
                if who:
                    return f"{path} is writable by {who}"
    except OSError as e:
        return f"{keyed}: {e.strerror or e}"
    return ""


def _private_dir() -> Path:
    path = Path(tempfile.mkdtemp(prefix="flashrt-numba-"))
    atexit.register(shutil.rmtree, path, True)
    return path


CACHE_DIR = cache_root().absolute() / source_key()
REFUSED = check_cache_dir(CACHE_DIR)
if REFUSED:
    logging.getLogger(__name__).warning(
        "flashrt: numba cache %s not used: %s (numba would run code another user planted there); compiling "
        "into a private temporary directory instead (1-3 min; set NUMBA_CACHE_DIR to a directory only you can "
        "write)", CACHE_DIR, REFUSED)
    CACHE_DIR = _private_dir()
numba.core.config.CACHE_DIR = str(CACHE_DIR)  # read when a cache=True function is decorated
