"""The capsule stream's limits (issue 44, point 6): its queue is sized from the window, so every documented
kv_window streams with the defaults; and resync requests, however many and however often, add at most two
keyframes per RESEND_MIN_S (each one is a whole-window encode on the stream thread)."""
from __future__ import annotations

import time

import pytest

from conftest import observation_trace, small_config
from flashrt_ros.runtime import Session
from flashrt_ros.runtime.persist.format import RESYNC
from flashrt_ros.runtime.persist.stream import MB, RESEND_MIN_S, queue_mb_for
from flashrt_ros.runtime.persist.tap import layout_of

OBS = observation_trace(400)


@pytest.mark.parametrize("kv_window", [4096, 16384])
def test_the_default_queue_holds_the_whole_window_records_of_every_documented_window(kv_window):
    # d_model 128 x 4 layers (the default model's KV entry): 16 / 64 MiB per whole-window record, which a fixed
    # 16 MiB queue could not hold twice ("cannot hold two whole-window records": the node failed to activate)
    s = Session(small_config(kv_window=kv_window, d_model=128, n_layers=4, n_heads=4, capsule_capacity=16,
                             max_branches=2, capsule_budget_mb=128.0 if kv_window == 4096 else 512.0))
    layout = layout_of(s)
    whole = 4 * layout.entry_floats * kv_window + layout.row_nbytes
    assert whole > 8 * MB  # the old fixed queue (16 MiB) is too small for two of them
    records = []
    stream = s.enable_stream(records.append)
    try:
        assert stream.log._queue_cap >= 3 * whole and queue_mb_for(layout) * MB == stream.log._queue_cap
        for o in OBS[:3]:
            s.step(o)
        assert stream.flush()
        assert [r.kind for r in records][:1] == [RESYNC] and len(records) == 3
        assert stream.stats().records_dropped == 0
    finally:
        s.disable_stream()
    with pytest.raises(ValueError, match="cannot hold two whole-window records"):  # an explicit size is checked
        s.enable_stream(records.append, queue_mb=whole / MB)


def test_a_resync_flood_adds_at_most_two_keyframes_per_resend_interval():
    s = Session(small_config(kv_window=150))
    records = []
    stream = s.enable_stream(records.append, keyframe_s=3600.0)
    for o in OBS[:5]:
        s.step(o)
    assert stream.flush()
    n0 = len(records)
    t0 = time.monotonic()
    answered = []
    for o in OBS[5:205]:  # a client asking before every step (the issue: ~80 requests per second)
        answered.append(stream.request_resync())
        s.step(o)
    assert stream.flush()
    elapsed = time.monotonic() - t0
    flood = records[n0:]
    keyframes = sum(r.kind == RESYNC for r in flood)
    # immediate resends at most every RESEND_MIN_S, and requested keyframes at most RESEND_MIN_S after the last
    bound = 2 * (elapsed / RESEND_MIN_S + 1)
    assert 1 <= keyframes <= bound, (keyframes, elapsed)
    assert sum(answered) <= elapsed / RESEND_MIN_S + 1
    assert len(flood) - sum(answered) == 200  # every step still streamed its own record
    s.disable_stream()
