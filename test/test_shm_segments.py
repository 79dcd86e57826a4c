"""Dead processes' Fast DDS segments are removed from /dev/shm, live or young ones never (ROS-free: a
directory of files stands in for /dev/shm, and a held flock for a living owner)."""
from __future__ import annotations

import fcntl
import os
import time

from flashrt_ros.ros.platform.shm_segments import MIN_AGE_S, removal_line, remove_dead_segments, skipped_line


def _segment(shm, name: str, age_s: float, size: int = 1 << 20) -> None:
    (shm / name).write_bytes(b"\1" * size)
    (shm / f"{name}_el").write_bytes(b"")
    past = time.time() - age_s
    os.utime(shm / f"{name}_el", (past, past))


def test_an_old_segment_nobody_holds_is_removed_with_its_lock(tmp_path):
    _segment(tmp_path, "fastdds_0123456789abcdef", MIN_AGE_S + 10)
    removed, freed = remove_dead_segments(tmp_path)
    assert (removed, os.listdir(tmp_path)) == (1, [])
    assert freed >= 1 << 20
    assert "removed 1 Fast DDS shared-memory segments" in removal_line(removed, freed)


def test_fast_dds_2_segments_of_humble_and_jazzy_are_removed_too(tmp_path):
    _segment(tmp_path, "fastrtps_0123456789abcdef", MIN_AGE_S + 10)
    assert remove_dead_segments(tmp_path)[0] == 1 and os.listdir(tmp_path) == []


def test_a_segment_whose_owner_holds_its_lock_stays(tmp_path):
    _segment(tmp_path, "fastdds_0123456789abcdef", MIN_AGE_S + 10)
    with open(tmp_path / "fastdds_0123456789abcdef_el", "rb") as owner:
        fcntl.flock(owner, fcntl.LOCK_EX | fcntl.LOCK_NB)  # another open file: a conflicting lock, as another process's
        assert remove_dead_segments(tmp_path) == (0, 0)
    assert sorted(os.listdir(tmp_path)) == ["fastdds_0123456789abcdef", "fastdds_0123456789abcdef_el"]


def test_a_young_unlocked_segment_stays_its_owner_may_be_starting(tmp_path):
    _segment(tmp_path, "fastdds_0123456789abcdef", 1.0)
    assert remove_dead_segments(tmp_path) == (0, 0)
    assert len(os.listdir(tmp_path)) == 2


def test_other_files_are_never_touched(tmp_path):
    for name in ("fastdds_port7411", "fastdds_port7411_el", "sem.fastdds_port7411_mutex", "other_el",
                 "fastdds_0123456789abcdefXX_el", "cyclonedds_0123456789abcdef_el"):
        (tmp_path / name).write_bytes(b"")
        os.utime(tmp_path / name, (0, 0))
    assert remove_dead_segments(tmp_path) == (0, 0)
    assert len(os.listdir(tmp_path)) == 6
    assert removal_line(0, 0) == ""


def test_a_missing_directory_is_nothing_to_do(tmp_path):
    assert remove_dead_segments(tmp_path / "absent") == (0, 0)


def _never_blocks(fn, *args, **kw):
    """fn(*args, **kw) in a thread that must end within 10 s (opening a FIFO for reading waits for a writer)."""
    import threading
    out = {}
    t = threading.Thread(target=lambda: out.setdefault("r", fn(*args, **kw)), daemon=True)
    t.start()
    t.join(10.0)
    return not t.is_alive(), out.get("r")


def _unblock(path):
    """Let a reader stuck opening the FIFO go (a writer appears)."""
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
    except OSError:
        pass


def test_a_fifo_or_a_link_planted_at_a_lock_file_name_is_skipped_never_opened(tmp_path):
    """Issue 44.4: anyone can create files in /dev/shm; a FIFO at a dead segment's lock name hung the node's
    start-up for good (open waited for a writer)."""
    _segment(tmp_path, "fastdds_0123456789abcdef", MIN_AGE_S + 10)  # a real dead one beside them
    fifo = tmp_path / "fastdds_00000000000000aa_el"
    os.mkfifo(fifo)
    (tmp_path / "fastdds_00000000000000bb_el").symlink_to(tmp_path / "fastdds_0123456789abcdef_el")
    for name in ("fastdds_00000000000000aa_el", "fastdds_00000000000000bb_el"):
        os.utime(tmp_path / name, (0, 0), follow_symlinks=False)
    skipped = []
    try:
        ended, result = _never_blocks(remove_dead_segments, tmp_path, skipped=skipped)
    finally:
        _unblock(fifo)
    assert ended, "remove_dead_segments waited on the FIFO"
    assert result[0] == 1
    assert sorted(os.listdir(tmp_path)) == ["fastdds_00000000000000aa_el", "fastdds_00000000000000bb_el"]
    assert skipped == [f"{fifo} is a FIFO"]
    line = skipped_line(skipped)
    assert "not regular files (planted? not opened)" in line and str(fifo) in line
    assert skipped_line([]) == ""
