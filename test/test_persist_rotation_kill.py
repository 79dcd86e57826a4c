"""A kill right after the writer opened a new segment (persist/writer.py _rotate: the header written, the record
not yet) leaves a newest segment with a header and no record. Reading the log goes on to the segment before it:
a resume continues from the newest capsule, and a fresh start next to that log still numbers after its ids."""
from __future__ import annotations

from persist_fixtures import cfg, settings

from conftest import observation_trace
from flashrt_ros.runtime import Session
from flashrt_ros.runtime.persist.format import iter_segment_paths, segment_header_bytes
from flashrt_ros.runtime.persist.tap import layout_of

OBS = observation_trace(40)


def _log_killed_after_a_rotation(tmp_path) -> Session:
    """30 steps logged, then the segment the next record would have opened: its header alone."""
    s = Session(cfg())
    s.enable_persistence(settings(tmp_path))
    for o in OBS[:30]:
        s.step(o)
    s.disable_persistence()
    newest = list(iter_segment_paths(tmp_path / "log"))[-1]
    header_only = newest.with_name(f"seg-{int(newest.stem[4:]) + 1:08d}.frl")
    header_only.write_bytes(segment_header_bytes(layout_of(s)))
    assert list(iter_segment_paths(tmp_path / "log"))[-1] == header_only
    return s


def test_a_resume_past_a_segment_with_only_its_header_continues_from_the_newest_capsule(tmp_path):
    s = _log_killed_after_a_rotation(tmp_path)
    r = Session(cfg())
    report = r.enable_persistence(settings(tmp_path), resume=True)
    assert (report.capsule_id, report.step) == (s.live_capsule_id, 30)
    assert r.state_host().tobytes() == s.state_host().tobytes()


def test_a_fresh_start_next_to_a_log_ending_in_a_header_only_segment_never_reuses_an_id(tmp_path):
    s = _log_killed_after_a_rotation(tmp_path)
    fresh = Session(cfg())
    fresh.enable_persistence(settings(tmp_path))  # resume off: the old log moves aside, its ids are not reused
    assert fresh.step(OBS[0]).capsule_id > s.live_capsule_id
