"""Replan: batch invariance, what-if vs commit, deadlines."""
import numpy as np
import pytest

from conftest import CPU_BACKENDS, observation_trace, small_config
from flashrt_ros.runtime import Session
from flashrt_ros.runtime.model.kernels import KV_PAGE


def run(session, obs):
    return np.stack([session.step(o).action for o in obs])


@pytest.fixture(params=CPU_BACKENDS)
def backend(request) -> str:
    return request.param


@pytest.fixture
def session(backend) -> Session:
    return Session(small_config(), backend=backend)


@pytest.mark.parametrize("branches", [1, 3, 8])
def test_replan_branches_equal_rollback_and_live_stepping_bytewise(branches, trace, backend):
    s = Session(small_config(), backend=backend)
    run(s, trace[:70])
    cid = s.live_capsule_id
    rng = np.random.default_rng(branches)
    obs = (trace[70:82][None] + 0.3 * rng.standard_normal((branches, 12, 14))).astype(np.float32)
    res = s.replan(cid, obs, deadline_ms=1e6)
    assert res.actions.shape == (branches, 12, 7) and res.deadline_met
    for b in range(branches):
        s.rollback(cid)
        assert run(s, obs[b]).tobytes() == res.actions[b].tobytes(), f"branch {b}"


@pytest.mark.parametrize("start, horizon, kv_window", [
    (120, 16, 48),  # crosses the page boundary at 128 inside the replan (a branch copies its partial page)
    (250, 12, 48),  # crosses 256: the page-table ring (2 slots at a 48 window) wraps back to slot 0
    (100, 70, 48),  # longer than the window: it wraps and a page crossing falls mid-replan
    (300, 100, 150),  # a 3-slot ring whose window spans three pages, crossing 384
], ids=["page_boundary", "ring_wrap", "window_wrap", "three_pages"])
def test_a_replan_crossing_pages_and_wrapping_the_window_equals_live_stepping_bytewise(start, horizon, kv_window,
                                                                                       backend):
    s = Session(small_config(kv_window=kv_window), backend=backend)
    trace = observation_trace(start + horizon, seed=5)
    run(s, trace[:start])
    cid = s.pin(s.live_capsule_id).id  # kept while the branches are stepped again below
    rng = np.random.default_rng(start)
    obs = (trace[start:][None] + 0.3 * rng.standard_normal((3, horizon, 14))).astype(np.float32)
    res = s.replan(cid, obs, deadline_ms=1e6)
    assert res.steps_done == horizon
    ends = [s.capsule_host(c).tobytes() for c in res.branch_capsule_ids]  # stepping below may evict them
    for b in range(3):
        s.rollback(cid)
        assert run(s, obs[b]).tobytes() == res.actions[b].tobytes(), f"branch {b}"
        assert s.state_host().tobytes() == ends[b], f"branch {b}'s end state"


@pytest.mark.parametrize("outcome", ["what_if", "commit", "cancelled"])
def test_after_a_replan_every_branch_row_reads_only_the_sink_page(session, trace, outcome):
    """Rows past a replan's branches are replayed too where the batch is a fixed graph (CUDA pads to max_branches):
    their device page tables must send every write to the sink page, never into a page a capsule holds."""
    run(session, trace[:70])
    obs = np.stack([trace[70:78] + 0.1 * b for b in range(5)]).astype(np.float32)
    kw = {"commit_branch": 2} if outcome == "commit" else {"cancel": lambda: True} if outcome == "cancelled" else {}
    session.replan(session.live_capsule_id, obs, **kw)
    kv = session.kv
    rows = session.cfg.max_branches
    assert (kv.tables[1:1 + rows] == -1).all()
    assert (np.asarray(session.backend.to_host(kv.device_tables))[1:1 + rows] == kv.sink).all()


def test_a_long_replan_never_holds_more_fresh_pages_than_it_reserved(backend):
    """Branches crossing page boundaries give each old page of their own back before the next row allocates
    (as a row at a time did), so the pages in use never grow past what check_room reserved for the replan."""
    s = Session(small_config(kv_window=48), backend=backend)
    trace = observation_trace(100 + 160, seed=3)
    run(s, trace[:100])
    b, h = 3, 160  # from step 100 across 128, 256 and 384: the 2-slot page ring wraps onto the branches' own pages
    kv, peak = s.kv, []
    alloc = kv.alloc

    def counting_alloc():
        page = alloc()
        peak.append(kv.pages_used)
        return page
    kv.alloc = counting_alloc
    before = kv.pages_used
    reserved = b * min(kv.P, (100 % KV_PAGE + h) // KV_PAGE + 1) + 1  # what replan.py asks check_room for
    s.replan(s.live_capsule_id, np.stack([trace[100:] + 0.1 * r for r in range(b)]).astype(np.float32))
    assert max(peak) - before <= reserved


def test_a_batch_of_copy_on_writes_that_runs_out_of_pages_gives_back_what_it_took(backend):
    """LogFull in the middle of the branches' copy-on-write: the pages taken for the rows before it are free
    again, and every reference count equals the tables and capsules that hold the page."""
    from flashrt_ros.runtime.state.kv_log import LogFull
    s = Session(small_config(), backend=backend)
    run(s, observation_trace(70, seed=4))  # mid-page: branches forked here share the live row's partial page
    kv = s.kv
    kv.set_row(1, kv.tables[0], 3)
    kv.evict_one = lambda: False
    spare = list(kv.free)[1:]
    for page in spare:  # one free page left for three rows that each need one
        kv.free.remove(page)
    with pytest.raises(LogFull):
        kv.prepare_branch_appends(1, 3, s.step_count)
    kv.free.extend(spare)
    _refs_match_what_holds_them(s)
    assert (kv.tables[1:4] == kv.tables[0]).all()  # no row moved to a page it could not fill


@pytest.mark.parametrize("gathered", [False, True])
def test_both_ways_of_copying_partial_pages_copy_exactly_the_filled_prefix_of_every_layer(backend, gathered):
    """The device way (one gather and scatter over the stacked logs) and the host way (a copy per page and log)
    write the same bytes: entries [0, n) of the old pages in every layer's k and v, nothing past n."""
    s = Session(small_config(), backend=backend)
    run(s, observation_trace(70, seed=5))
    kv = s.kv
    old = np.array([int(kv.tables[0, (69 // KV_PAGE) % kv.P])] * 3)
    new = np.array([kv.alloc() for _ in range(3)])
    for log in kv.k + kv.v:
        log[new] = -7.0  # what a fresh page held before: must survive past the prefix
    n = 69 % KV_PAGE
    kv._copy_prefixes(new, old, n, gathered=gathered)
    for log in kv.k + kv.v:
        assert log[new, :n].tobytes() == np.repeat(log[old[:1], :n], 3, axis=0).tobytes()
        assert (log[new, n:] == -7.0).all()


def _branches_alone_on_a_filled_page(backend):
    """A session stepped to 70 and three branch rows forked at step 60: page 0 is filled to 70 (copy-on-write
    for a branch appending at 60), and nothing else holds it (no capsule, not the live row). Returns (session,
    old page, its k/v prefix bytes)."""
    s = Session(small_config(), backend=backend)
    run(s, observation_trace(70, seed=6))
    kv = s.kv
    src = next(c for c in s.list_capsules() if c.step == 60)
    kv.set_row(1, s.store.pages_of(src.id), 3)
    old = int(kv.tables[1, 0])
    want = [log[old, :60].tobytes() for log in kv.k + kv.v]
    for c in s.list_capsules():
        s.store.drop(c.id)
    kv.clear_row(0)
    assert kv.refs[old] == 3 and kv.fill[old] == 70
    return s, old, want


def _refs_match_what_holds_them(s):
    kv = s.kv
    held = np.concatenate([kv.tables.ravel()] + [p.new_pages() for p in kv.pending]
                          + [s.store.pages_of(c.id) for c in s.list_capsules()])
    assert (kv.refs == np.bincount(held[held >= 0], minlength=kv.n_pages)[:kv.n_pages]).all()
    assert len(set(kv.free)) == len(kv.free) == int((kv.refs == 0).sum())


@pytest.mark.parametrize("kv_window", [48, 2304])  # 2 and 19 table slots: either side of KvLog.SHORT_TABLE
def test_page_refcounts_equal_what_holds_them_through_evictions_rollbacks_and_replans(kv_window, backend):
    s = Session(small_config(kv_window=kv_window, capsule_capacity=40), backend=backend)
    assert (s.kv.P > s.kv.SHORT_TABLE) == (kv_window > 1000)
    trace = observation_trace(420, seed=9)
    run(s, trace[:300])  # a full store: every step evicts its oldest capsule
    _refs_match_what_holds_them(s)
    s.rollback(s.list_capsules()[5].id)
    s.replan(s.list_capsules()[-1].id, np.stack([trace[300:308]] * 3))
    run(s, trace[308:420])
    for c in s.list_capsules():  # down to the live row alone: each page's count passes 1 on its way to 0
        s.store.drop(c.id)
        _refs_match_what_holds_them(s)


def test_a_copy_on_write_done_off_the_lock_holds_the_old_page_until_copied_whatever_reuses_free_pages(backend):
    """A replan's fork copies its partial pages outside the session lock (a live step runs meanwhile): until
    finish_pending the old page stays held and the fresh ones count as taken, so a live step that evicts and
    reuses every free page cannot change what is copied."""
    s, old, want = _branches_alone_on_a_filled_page(backend)
    kv = s.kv
    obtainable = kv.pages_obtainable([])
    pending = kv.prepare_branch_appends(1, 3, 60, defer_copies=True)
    assert pending is not None and [c[0] for c in pending.copies] == [1, 2, 3]
    assert (kv.tables[1:4, 0] == old).all()  # the rows still read the old page
    assert kv.pages_obtainable([]) == obtainable - 3  # the fresh pages count as held before a table names them
    _refs_match_what_holds_them(s)
    for page in kv.free:  # meanwhile: every free page reused and overwritten
        for log in kv.k + kv.v:
            log[page] = -7.0
    kv.copy_pending(pending)
    kv.finish_pending(pending, copied=True)
    new = [int(p) for p in kv.tables[1:4, 0]]
    assert kv.pending == [] and len(set(new)) == 3 and old not in new
    for page in new:
        assert [log[page, :60].tobytes() for log in kv.k + kv.v] == want
        assert kv.fill[page] == 61
    assert kv.refs[old] == 0 and old in kv.free  # given back once copied
    _refs_match_what_holds_them(s)


def test_a_copy_on_write_that_failed_off_the_lock_gives_its_pages_back_and_leaves_the_rows(backend):
    s, old, _ = _branches_alone_on_a_filled_page(backend)
    kv = s.kv
    free = len(kv.free)
    pending = kv.prepare_branch_appends(1, 3, 60, defer_copies=True)
    kv.finish_pending(pending, copied=False)
    assert kv.pending == [] and len(kv.free) == free and (kv.tables[1:4, 0] == old).all()
    _refs_match_what_holds_them(s)


def test_a_replan_interrupted_between_its_forks_sections_gives_every_page_back(backend, monkeypatch):
    """An exception (a signal) right after the fork took its fresh pages, before the copy: the replan's end
    gives them back with the branch rows, so nothing stays referenced and the next replan is unchanged."""
    s = Session(small_config(), backend=backend)
    run(s, observation_trace(70, seed=7))
    kv = s.kv
    free = len(kv.free)
    prepare = kv.prepare_branch_appends

    def interrupted(*args, **kw):
        if prepare(*args, **kw) is not None:
            raise KeyboardInterrupt
    monkeypatch.setattr(kv, "prepare_branch_appends", interrupted)
    with pytest.raises(KeyboardInterrupt):
        s.replan(None, np.repeat(observation_trace(4, seed=8)[None], 3, axis=0), deadline_ms=1e6)
    monkeypatch.undo()
    assert kv.pending == [] and len(kv.free) == free
    _refs_match_what_holds_them(s)


def test_replan_without_commit_leaves_live_state_byte_identical(session, trace):
    run(session, trace[:30])
    before, live_id, step = session.state_host(), session.live_capsule_id, session.step_count
    session.replan(live_id - 10, np.repeat(trace[None, 100:108], 4, axis=0), deadline_ms=1e6)
    assert session.state_host().tobytes() == before.tobytes()
    assert (session.live_capsule_id, session.step_count) == (live_id, step)


def test_replan_branch_end_capsules_hold_the_branch_state(session, trace):
    run(session, trace[:30])
    res = session.replan(0, np.stack([trace[40:46], trace[60:66]]), deadline_ms=1e6)
    for b, cid in enumerate(res.branch_capsule_ids):
        info = session.store.get(cid)
        assert info.step == 36 and info.parent_id == 30
        session.rollback(30)
        run(session, [trace[40:46], trace[60:66]][b])
        assert session.state_host().tobytes() == session.capsule_host(cid).tobytes()


def test_commit_makes_the_branch_live(session, trace):
    run(session, trace[:30])
    obs = np.stack([trace[50:58], trace[80:88], trace[90:98]])
    res = session.replan(25, obs, commit_branch=1, deadline_ms=1e6)
    assert session.live_capsule_id == res.branch_capsule_ids[1] == res.live_capsule_id
    assert session.step_count == 33
    nxt = run(session, trace[200:210])
    session.rollback(25)
    run(session, obs[1])
    assert run(session, trace[200:210]).tobytes() == nxt.tobytes()


def test_deadline_abandons_the_rest_and_says_so(session, trace):
    run(session, trace[:10])
    before = session.state_host()
    res = session.replan(0, np.repeat(trace[None, :200], 8, axis=0), deadline_ms=0.5)
    assert not res.deadline_met and res.steps_done < 200
    assert res.actions.shape == (8, res.steps_done, 7)
    assert "deadline" in res.message
    assert session.state_host().tobytes() == before.tobytes()


def test_cancel_stops_between_steps(session, trace):
    run(session, trace[:10])
    calls = []
    res = session.replan(0, np.repeat(trace[None, :20], 2, axis=0), deadline_ms=1e6,
                         cancel=lambda: len(calls) >= 3, on_step=calls.append)
    assert res.steps_done == 3 and "cancelled" in res.message and not res.deadline_met


def test_a_prepared_session_binds_nothing_at_any_replan(backend, trace):
    """prepare_replans pays the one-time costs at configure: no replan, of any batch size, binds a plan then
    (a fresh node's first replan took 35-43 ms to its first step and missed its 50 ms deadline)."""
    s = Session(small_config(), backend=backend)
    s.prepare_replans()
    run(s, trace[:20])

    def no_bind(*args, **kwargs):
        raise AssertionError("a replan bound a plan inside its deadline")
    s.backend.bind = no_bind
    for branches in range(1, s.cfg.max_branches + 1):
        res = s.replan(None, np.repeat(trace[None, 20:23], branches, axis=0), deadline_ms=1e6)
        assert res.actions.shape[:2] == (branches, 3)
