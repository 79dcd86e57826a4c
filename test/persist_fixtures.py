"""Shared by the persistence tests: a small config whose window wraps, and log settings for a temp dir."""
from __future__ import annotations

import shutil

from conftest import small_config
from flashrt_ros.runtime.persist.writer import PersistSettings


def settings(tmp_path, **kw) -> PersistSettings:
    """No fsync (tests do not survive power cuts), 1 MB segments, a budget that never evicts."""
    base = dict(directory=tmp_path / "log", fsync_every_ms=0.0, segment_mb=1.0, budget_mb=64.0)
    base.update(kw)
    return PersistSettings(**base)


def cfg(**kw):
    return small_config(kv_window=150, **kw)  # 2 pages + a wrap within a few hundred steps


def crash_copy(s, tmp_path, name: str, **kw) -> PersistSettings:
    """What a kill -9 of ``s`` right now leaves on disk once its queue is written: the persist_dir copied
    while ``s`` keeps running (its lock, its open segment). Returns settings for the copy."""
    assert s.persistence.flush()
    dest = tmp_path / name
    shutil.copytree(s.persistence.log.dir, dest, ignore=shutil.ignore_patterns(".*.tmp"))  # renamed meanwhile
    return settings(tmp_path, directory=dest, **kw)
