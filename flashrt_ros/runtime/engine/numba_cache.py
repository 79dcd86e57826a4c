"""The compiled CPU step's on-disk cache, keyed by the source of every module compiled into it.

numba keys a cached function on its own file only, and run_program (cpu_kernels.py) compiles in
cpu_attention.py, cpu_program.py and kernel_spec.py's constants: an edit to one of those alone would keep
running the old machine code read from the cache. Importing this module, before any ``@njit`` of those
modules runs, points numba at ``<root>/<hash of those sources>``, so any edit gets a fresh directory.
Root: ``NUMBA_CACHE_DIR`` when set, else ``$XDG_CACHE_HOME/flashrt_ros/numba`` (``~/.cache/...``).
Directories of older sources stay behind until removed by hand (a few MiB each).
"""
from __future__ import annotations

import hashlib
import os
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


CACHE_DIR = cache_root().absolute() / source_key()
numba.core.config.CACHE_DIR = str(CACHE_DIR)  # read when a cache=True function is decorated
