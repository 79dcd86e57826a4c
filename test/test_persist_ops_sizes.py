"""Issue 15, 7.3 / 7.14 / 7.15 / 7.17: the capsule log's queue and segments are sized from its largest
record, a segment name taken by something else is skipped, and moved-aside logs are bounded."""
from __future__ import annotations

import logging
import math
import os

import pytest
from persist_fixtures import cfg, settings

from conftest import assert_refused_unchanged, observation_trace
from flashrt_ros.runtime import Session
from flashrt_ros.runtime.persist.attach import STALE_KEEP, layout_of, move_aside
from flashrt_ros.runtime.persist.writer import MB, SEGMENT_MIN_RECORDS, whole_window_bytes

OBS = observation_trace(300)


def record_mb(s: Session) -> float:
    return whole_window_bytes(layout_of(s)) / MB


def resumed_step(tmp_path, **kw) -> int:
    r = Session(cfg())
    report = r.enable_persistence(settings(tmp_path, **kw), resume=True)
    r.disable_persistence()
    return report.step


def test_a_queue_smaller_than_one_whole_window_record_still_writes_every_record(tmp_path, caplog):
    s = Session(cfg())
    queue_mb = record_mb(s) / 2  # a RESYNC (the first record, and the one after a rollback) never fit
    with caplog.at_level(logging.WARNING):
        s.enable_persistence(settings(tmp_path, queue_mb=queue_mb))
    assert any("persist_queue_mb" in r.getMessage() and "raised" in r.getMessage() for r in caplog.records)
    for o in OBS[:30]:
        s.step(o)
    # a sizing test, not a race with the writer: the RESYNC after the rollback meets a drained queue, which
    # must take it whole (before the fix no RESYNC ever fit, however empty the queue)
    assert s.persistence.flush()
    s.rollback(steps_back=5)
    for o in OBS[30:40]:
        s.step(o)
    assert s.persistence.flush()
    st = s.persistence.stats()
    s.disable_persistence()
    assert (st.records_written, st.records_dropped) == (40, 0), st
    assert resumed_step(tmp_path) == s.step_count


def test_segments_smaller_than_their_whole_window_records_are_raised_so_records_stay_deltas(tmp_path, caplog):
    s = Session(cfg())
    with caplog.at_level(logging.WARNING):
        s.enable_persistence(settings(tmp_path, segment_mb=record_mb(s) / 2))
    assert any("persist_segment_mb" in r.getMessage() and "raised" in r.getMessage() for r in caplog.records)
    for o in OBS[:100]:
        s.step(o)
    assert s.persistence.flush()
    st = s.persistence.stats()
    s.disable_persistence()
    # one whole-window record opens each segment and a segment holds many records: before, each record
    # filled a segment of its own, every record was a whole window and the writer fell behind the robot
    assert st.records_written == 100 and st.resyncs_written == st.segments <= 2, st
    assert resumed_step(tmp_path) == 100


def test_a_budget_that_cannot_hold_two_raised_segments_is_refused_naming_the_budget(tmp_path):
    s = Session(cfg())
    for o in OBS[:5]:
        s.step(o)
    need = SEGMENT_MIN_RECORDS * record_mb(s)
    budget = math.floor(1.5 * need * 100) / 100  # two of the asked segments, not two of the raised ones
    assert_refused_unchanged(s, lambda: s.enable_persistence(settings(tmp_path, segment_mb=need / 8,
                                                                      budget_mb=budget)),
                             ValueError, "persist_budget_mb.*whole-window records")
    assert s.persistence is None


@pytest.mark.parametrize("squatter", ["fifo", "directory", "dangling link"])
def test_a_fifo_directory_or_link_at_the_next_segment_name_is_skipped_and_the_log_continues(tmp_path, squatter):
    log = tmp_path / "log"
    log.mkdir(mode=0o700)
    taken = [log / "seg-00000001.frl", log / "seg-00000002.frl"]
    for path in taken:
        if squatter == "fifo":
            os.mkfifo(path)  # opened blindly for writing, it would block the writer for good
        elif squatter == "directory":
            path.mkdir()
        else:
            path.symlink_to(tmp_path / "elsewhere")
    s = Session(cfg())
    s.enable_persistence(settings(tmp_path))
    for o in OBS[:20]:
        s.step(o)
    assert s.persistence.flush()
    st = s.persistence.stats()
    s.disable_persistence()
    assert (st.records_written, st.write_errors) == (20, 2), st
    assert "seg-00000002.frl is taken" in st.last_error
    assert (log / "seg-00000003.frl").is_file() and not (tmp_path / "elsewhere").exists()
    assert resumed_step(tmp_path) == 20


def test_moved_aside_logs_are_bounded_to_the_newest_few_with_a_log_line(tmp_path, caplog):
    directory = tmp_path / "log"
    directory.mkdir()
    moved = []
    with caplog.at_level(logging.WARNING):
        for i in range(STALE_KEEP + 2):
            (directory / "seg-00000001.frl").write_bytes(b"old log %d" % i)
            moved.append(move_aside(directory))
    kept = sorted(p.name for p in directory.glob("stale-*"))
    assert kept == sorted(p.name for p in moved[-STALE_KEEP:])
    assert (moved[-1] / "seg-00000001.frl").read_bytes() == b"old log %d" % (STALE_KEEP + 1)
    deleted = [r.getMessage() for r in caplog.records if "deleted stale-" in r.getMessage()]
    assert len(deleted) == 2 and moved[0].name in deleted[0]
