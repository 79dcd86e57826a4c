"""Works around eProsima/Fast-DDS#2790 (https://github.com/eProsima/Fast-DDS/issues/2790: segments of killed
processes fill /dev/shm; Fast DDS only offers the `fastdds shm clean` tool); off: the node's
``clean_dead_shm_segments`` false.

Fast DDS shared-memory segments that dead processes left in /dev/shm (kill -9, a crash): each keeps its
RAM (tmpfs) until it is removed, up to 16 MiB with the shipped profile, so a robot whose node is restarted
after crashes loses memory with each one. ROS-free, unit-tested without a graph.

A segment's owner holds an exclusive flock on ``<segment>_el`` for as long as it lives (Fast DDS's
RobustExclusiveLock; its `fastdds shm clean` tool relies on the same). A lock file nobody holds is a dead
owner's, unless it is younger than MIN_AGE_S: a participant starting now creates the file before it locks it.
"""
from __future__ import annotations

import os
import re
import stat
import time
from pathlib import Path

try:
    import fcntl
except ImportError:  # not POSIX: Fast DDS keeps its segments elsewhere there
    fcntl = None

SHM_DIR = Path("/dev/shm")
SEGMENT_LOCK = re.compile(r"^(fastdds|fastrtps)_[0-9a-z]{16}_el$")  # Fast DDS 3 (Kilted) / 2.x (Humble, Jazzy)
MIN_AGE_S = 60.0


class NotRegularFile(OSError):
    pass


def open_regular(path: Path) -> int:
    """A read-only descriptor of ``path``, which must be a regular file: never through a symbolic link and never
    blocking (anyone can create files in /dev/shm; opening a FIFO planted at a lock file's name would wait for a
    writer forever). NotRegularFile names what it is instead; other OSErrors as os.open raises them."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        kind = "a FIFO" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode) else "not a regular file"
        raise NotRegularFile(f"{path} is {kind}")
    return fd


def skipped_line(skipped: list[str]) -> str:
    """One line for the node's log naming what was skipped ('' when nothing was)."""
    if not skipped:
        return ""
    return (f"skipped {len(skipped)} files in /dev/shm named like Fast DDS lock files that are not regular files "
            f"(planted? not opened): {'; '.join(skipped[:4])}{' ...' if len(skipped) > 4 else ''}")


def remove_dead_segments(shm_dir: Path = SHM_DIR, min_age_s: float = MIN_AGE_S,
                         skipped: list[str] | None = None) -> tuple[int, int]:
    """Remove the segments (and their lock files) no process holds; returns (segments removed, bytes of RAM
    they held). Anything that cannot be read, locked or removed is left alone; a lock file that is not a
    regular file (a FIFO, a link) is never opened, and is named in ``skipped``."""
    if fcntl is None:
        return 0, 0
    try:
        names = os.listdir(shm_dir)
    except OSError:
        return 0, 0
    removed = freed = 0
    now = time.time()
    for name in names:
        if not SEGMENT_LOCK.match(name):
            continue
        lock, segment = shm_dir / name, shm_dir / name[:-len("_el")]
        try:
            if now - os.lstat(lock).st_mtime < min_age_s:
                continue
            held = open_regular(lock)
        except NotRegularFile as e:
            if skipped is not None:
                skipped.append(str(e))
            continue
        except OSError:
            continue  # gone meanwhile, or a link (O_NOFOLLOW)
        try:
            try:
                fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                continue  # its owner lives
            seg = os.lstat(segment) if os.path.lexists(segment) else None
            size = seg.st_blocks * 512 if seg is not None and stat.S_ISREG(seg.st_mode) else 0
            segment.unlink(missing_ok=True)
            lock.unlink()
        except OSError:
            continue
        finally:
            os.close(held)
        removed, freed = removed + 1, freed + size
    return removed, freed


def removal_line(removed: int, freed: int) -> str:
    """One line for the node's log ('' when nothing was removed)."""
    if not removed:
        return ""
    return (f"removed {removed} Fast DDS shared-memory segments of dead processes from /dev/shm "
            f"({freed / 2**20:.0f} MiB of RAM; kill -9 leaves them)")


__all__ = ["MIN_AGE_S", "NotRegularFile", "open_regular", "remove_dead_segments", "removal_line", "skipped_line"]
