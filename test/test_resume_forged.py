"""Records with a valid checksum that break the log's rules are refused, never loaded (issue 15, items 2.7
and 2.8): a repeated whole-window record, a delta that skips a step, a non-finite KV entry, a delta with
more entries than the window. Refusals leave the session as it was."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from persist_fixtures import cfg, settings

from conftest import assert_refused_unchanged, observation_trace
from flashrt_ros.runtime import Session
from flashrt_ros.runtime.persist.attach import layout_of, read_for_resume
from flashrt_ros.runtime.persist.format import DELTA, RESYNC, LogCorrupt, encode_record, iter_segment_paths, scan
from flashrt_ros.runtime.persist.resume import meta_reader, rebuild

OBS = observation_trace(400)


def logged(tmp_path, n: int, c=None, **kw) -> Session:
    s = Session(c or cfg())
    s.enable_persistence(settings(tmp_path, **kw))
    for o in OBS[:n]:
        s.step(o)
    s.disable_persistence()
    return s


def records(s, seg):
    recs, err = scan(seg, seg.read_bytes(), layout_of(s), meta_reader(s.arena))
    assert err is None
    return recs


def rewrite(seg, recs, parts) -> None:
    """The segment's header, then ``parts``: record indices (kept as they are) or bytes (forged records)."""
    blob = seg.read_bytes()
    out = [blob[:recs[0].offset]]
    for p in parts:
        out.append(p if isinstance(p, bytes) else blob[recs[p].offset:recs[p].offset + recs[p].nbytes])
    seg.write_bytes(b"".join(out))


def forge(s, rec, kind=None, kv=None, **info) -> bytes:
    """The record re-encoded with other fields: a valid checksum over whatever it says."""
    cap = replace(s.capsule_info(rec.id), **info)
    kv = rec.kv if kv is None else kv
    kind = rec.kind if kind is None else kind
    n = len(kv) if kind == DELTA else min(cap.step, s.cfg.kv_window)
    return encode_record(kind, cap, rec.small, kv, n)


def something_to_lose() -> Session:
    r = Session(cfg())
    r.step(OBS[300])
    return r


def test_a_repeated_whole_window_record_is_refused_as_out_of_order_before_anything_changes(tmp_path):
    logged(tmp_path, 30)
    seg = next(iter_segment_paths(tmp_path / "log"))
    s = Session(cfg())
    recs = records(s, seg)
    assert recs[0].kind == RESYNC and len(recs) > 3
    rewrite(seg, recs, [0, 0, *range(1, len(recs))])  # the whole-window record twice, back to back
    r = something_to_lose()
    assert_refused_unchanged(r, lambda: r.enable_persistence(settings(tmp_path), resume=True), LogCorrupt,
                             f"{seg.name}: offset \\d+: capsule id {recs[0].id} after {recs[0].id}: ids must increase")


def test_rebuilding_a_log_that_holds_a_capsule_twice_is_log_corrupt_and_touches_nothing(tmp_path):
    logged(tmp_path, 30)
    r = something_to_lose()
    contents = read_for_resume(r, tmp_path / "log")
    twice = replace(contents, records=[contents.records[0], *contents.records])  # past check_timeline
    assert_refused_unchanged(r, lambda: rebuild(r, twice), LogCorrupt, "recorded twice")
    off_timeline = replace(contents.records[0], id=contents.records[-1].id + 1, pinned=True)
    pins = replace(contents, pins=[off_timeline, off_timeline])
    assert_refused_unchanged(r, lambda: rebuild(r, pins), LogCorrupt, "recorded twice")


def test_a_delta_that_skips_a_step_is_refused_even_when_it_names_the_record_before_it(tmp_path):
    s = logged(tmp_path, 20)
    seg = next(iter_segment_paths(tmp_path / "log"))
    recs = records(s, seg)
    # record 7 gone, record 8 re-signed to name record 6 as its parent: only the step gap tells
    rewrite(seg, recs, [*range(7), forge(s, recs[8], parent_id=recs[6].id), *range(9, len(recs))])
    r = something_to_lose()
    assert_refused_unchanged(r, lambda: r.enable_persistence(settings(tmp_path), resume=True), LogCorrupt,
                             "at step 7 follows capsule 7 at step 7|missing or out of order")


@pytest.mark.parametrize("where", ["last", "middle"])
def test_a_non_finite_kv_entry_under_a_valid_checksum_is_never_loaded(tmp_path, where):
    s = logged(tmp_path, 20)
    seg = next(iter_segment_paths(tmp_path / "log"))
    recs = records(s, seg)
    i = len(recs) - 1 if where == "last" else 10
    kv = recs[i].kv.copy()
    kv[0, 0, 1, 3] = np.nan
    rewrite(seg, recs, [*range(i), forge(s, recs[i], kv=kv), *range(i + 1, len(recs))])
    r = something_to_lose()
    if where == "middle":
        assert_refused_unchanged(r, lambda: r.enable_persistence(settings(tmp_path), resume=True), LogCorrupt,
                                 "non-finite KV entries")
        return
    report = r.enable_persistence(settings(tmp_path), resume=True)  # the tail: cut, as a torn record
    r.disable_persistence()
    assert (report.step, report.records_cut) == (19, 1) and "non-finite" in report.cut
    assert r.state_host().tobytes() == s.capsule_host(19).tobytes()


def test_a_delta_with_more_entries_than_the_window_is_never_loaded(tmp_path):
    w = 150
    c = cfg(capsule_every_n_steps=w + 1)  # capsules 151 steps apart: the writer makes each a whole window
    s = logged(tmp_path, 2 * (w + 1), c)
    seg = next(iter_segment_paths(tmp_path / "log"))
    recs = records(s, seg)
    assert [r.step for r in recs] == [w + 1, 2 * (w + 1)]
    entries = np.zeros((w + 1, c.n_layers, 2, c.d_model), np.float32)  # finite, and one more than a window
    rewrite(seg, recs, [0, forge(s, recs[1], kind=DELTA, kv=entries)])
    r = Session(c)
    report = r.enable_persistence(settings(tmp_path), resume=True)
    r.disable_persistence()
    assert (report.step, report.records_cut) == (w + 1, 1) and f"with {w + 1} entries" in report.cut
