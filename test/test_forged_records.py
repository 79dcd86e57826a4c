"""Forged persisted records (issue 15, 7.4): a record whose crc32 was recomputed over a state no run of
the policy can produce is refused at resume (LogCorrupt naming the file), never loaded, never cut as a
torn tail."""
from __future__ import annotations

from dataclasses import replace as dc_replace

import numpy as np
import pytest
from persist_fixtures import cfg, settings

from conftest import assert_refused_unchanged, observation_trace
from flashrt_ros.runtime import Session
from flashrt_ros.runtime.persist.attach import layout_of
from flashrt_ros.runtime.persist.format import RESYNC, LogCorrupt, encode_record, iter_segment_paths, scan
from flashrt_ros.runtime.persist.resume import meta_reader

OBS = observation_trace(60)


def _logged(tmp_path, n=20) -> Session:
    s = Session(cfg())
    s.enable_persistence(settings(tmp_path))
    for o in OBS[:n]:
        s.step(o)
    s.disable_persistence()
    return s


def _forge(s, tmp_path, which: int, small=None, kv=None, stamp_ns=None) -> None:
    """Rewrite record ``which`` of the segment with its small state / KV / stamp changed, crc32 recomputed."""
    seg = next(iter_segment_paths(tmp_path / "log"))
    blob = seg.read_bytes()
    recs, err = scan(seg, blob, layout_of(s), meta_reader(s.arena))
    assert err is None
    rec = recs[which]
    row, entries = rec.small.copy(), rec.kv.copy()
    if small is not None:
        name, value = small
        s.arena.row_view(name, row).reshape(-1)[0] = value
    if kv is not None:
        entries.reshape(-1)[-1] = kv
    info = dc_replace(s.capsule_info(rec.id) if rec.id in s.store else s.list_capsules()[0], id=rec.id,
                      parent_id=rec.parent_id, step=rec.step,
                      stamp_ns=rec.stamp_ns if stamp_ns is None else stamp_ns, label=rec.label)
    n = 0 if rec.kind == RESYNC else len(rec.kv)
    n = min(rec.step, s.cfg.kv_window) if rec.kind == RESYNC else n
    forged = encode_record(rec.kind, info, row, entries, n)
    seg.write_bytes(blob[:rec.offset] + forged + blob[rec.offset + rec.nbytes:])


@pytest.mark.parametrize("which, change, match", [
    (-1, dict(small=("mtp_state", 7.4e29)), r"capsule 20: mtp_state .*7\.4e\+29"),
    (-1, dict(small=("recurrent_state.0", 2.0)), r"capsule 20: recurrent_state\.0"),
    (-1, dict(small=("conv_state.1", np.inf)), r"capsule 20: conv_state\.1 .*non-finite"),
    (-1, dict(kv=1e7), r"capsule 20: KV entries"),
    (0, dict(kv=-1e7), r"capsule 1: KV entries"),  # the RESYNC the timeline starts at
    # inside the log (the last record would be cut as a torn tail, never loaded): list_capsules could not send it
    (5, dict(stamp_ns=2**62), r"stamp 4611686018427387904 ns is out of range; valid records follow"),
    (5, dict(stamp_ns=-1), r"stamp -1 ns is out of range; valid records follow"),
], ids=["mtp_extreme", "gru_beyond_1", "conv_inf", "delta_kv_extreme", "resync_kv_extreme", "stamp_past_ros_time",
        "stamp_before_1970"])
def test_a_forged_record_with_a_recomputed_crc_is_refused_at_resume(tmp_path, which, change, match):
    s = _logged(tmp_path)
    _forge(s, tmp_path, which, **change)
    r = Session(cfg())
    r.step(OBS[0])  # something to lose
    assert_refused_unchanged(r, lambda: r.enable_persistence(settings(tmp_path), resume=True), LogCorrupt, match)
    assert r.persistence is None


def test_an_unforged_rewrite_still_resumes(tmp_path):
    s = _logged(tmp_path)
    _forge(s, tmp_path, -1)
    r = Session(cfg())
    report = r.enable_persistence(settings(tmp_path), resume=True)
    r.disable_persistence()
    assert report.capsule_id == 20 and r.state_host().tobytes() == s.state_host().tobytes()
