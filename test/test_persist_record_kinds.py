"""Which record a capsule becomes in the log (persist/tap.py, RecordQueue.wants_resync): a DELTA of the entries
since the last record while they fit in the window, a whole-window RESYNC once they would not."""
from __future__ import annotations

import pytest
from persist_fixtures import cfg, settings

from conftest import observation_trace
from flashrt_ros.runtime import Session

KV_WINDOW = 150  # persist_fixtures.cfg
OBS = observation_trace(3 * KV_WINDOW + 3)


@pytest.mark.parametrize(("every", "resyncs"), [(KV_WINDOW, 1), (KV_WINDOW + 1, 3)])
def test_capsules_a_whole_window_apart_are_deltas_and_one_step_further_apart_each_stand_alone(tmp_path, every, resyncs):
    c = cfg(capsule_every_n_steps=every)
    assert c.kv_window == KV_WINDOW
    s = Session(c)
    s.enable_persistence(settings(tmp_path))
    for o in OBS[:3 * every]:
        s.step(o)
    assert s.persistence.flush()
    st = s.persistence.stats()
    assert (st.records_written, st.resyncs_written) == (3, resyncs)  # the first record always stands alone
    s.disable_persistence()
    r = Session(c)
    report = r.enable_persistence(settings(tmp_path), resume=True)
    assert report.step == 3 * every and r.state_host().tobytes() == s.state_host().tobytes()
