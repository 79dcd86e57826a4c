"""On a CUDA device (skipped without one): graph replay, restore, batch invariance, NumPy agreement, and
the paged KV log on the device: wrap-around eviction and windows that span several pages."""
import numpy as np
import pytest

from conftest import assert_states_close, observation_trace, small_config
from flashrt_ros.runtime import PolicyConfig, Session, UnknownCapsule
from flashrt_ros.runtime.engine.backend import cuda_probe
from flashrt_ros.runtime.model.kernels import KV_PAGE
from flashrt_ros.runtime.state.sizing import StoreSizes

NO_GPU = cuda_probe()
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(NO_GPU is not None, reason=f"no CUDA device: {NO_GPU}")]
BACKEND = "cuda"  # the paged-log tests below take it from here


def actions(s, obs):
    return np.stack([s.step(o).action for o in obs])


GPU_CFG = PolicyConfig(capsule_capacity=64, action_noise_std=0.02)  # the default model, a small store


@pytest.fixture(scope="module")
def gpu():
    return Session(GPU_CFG, "cuda")


def test_graph_replay_equals_eager_launches_bit_for_bit():
    """Its own session: eager launches go through `step` (page bookkeeping and all). Launching the live
    step's kernels without it wrote KV through stale page tables and broke every later test sharing the
    session (H200, 2026-12-04)."""
    s = Session(GPU_CFG, "cuda")
    obs = observation_trace(80)
    actions(s, obs[:40])
    cid = s.pin(s.live_capsule_id).id
    graph = actions(s, obs[40:80])
    graph_state = s.state_host()
    s.rollback(cid)
    s._live.replay = s._live.replay_eager  # the same launches, one by one instead of the captured graph
    try:
        eager = actions(s, obs[40:80])
    finally:
        del s._live.replay
    assert eager.tobytes() == graph.tobytes()
    assert s.state_host().tobytes() == graph_state.tobytes()


def test_cuda_restore_is_byte_exact_after_dirty_branches(gpu):
    obs = observation_trace(200, seed=2)
    actions(gpu, obs[:50])
    cid = gpu.pin(gpu.live_capsule_id).id
    slab = gpu.state_host()
    first = actions(gpu, obs[50:114])
    gpu.replan(0, np.ones((8, 6, 14), np.float32))
    actions(gpu, obs[114:190])
    gpu.rollback(cid)
    assert gpu.state_host().tobytes() == slab.tobytes()
    assert actions(gpu, obs[50:114]).tobytes() == first.tobytes()


def test_cuda_branch_rows_read_only_the_sink_page_after_a_replan(gpu):
    """The graph replays all max_branches rows: after a 3-branch replan (the branches' tables written as one
    block, their partial pages copied in one gather), every branch row must point at the sink page again."""
    obs = observation_trace(80, seed=9)
    actions(gpu, obs[:70])
    gpu.replan(gpu.live_capsule_id, np.stack([obs[70:76] + 0.1 * b for b in range(3)]).astype(np.float32))
    tables = gpu.backend.to_host(gpu.kv.device_tables)
    assert (tables[1:1 + gpu.cfg.max_branches] == gpu.kv.sink).all()


@pytest.mark.parametrize("branches", [1, 3, 8])
def test_cuda_replan_branches_equal_live_stepping_bytewise(gpu, branches):
    obs = observation_trace(120, seed=branches)
    actions(gpu, obs[:60])
    cid = gpu.pin(gpu.live_capsule_id).id
    plan = np.stack([obs[60:70] + 0.1 * b for b in range(branches)]).astype(np.float32)
    res = gpu.replan(cid, plan, deadline_ms=1e6)
    for b in range(branches):
        gpu.rollback(cid)
        assert actions(gpu, plan[b]).tobytes() == res.actions[b].tobytes(), f"branch {b}"


def test_cuda_matches_numpy_within_tolerance_over_200_steps():
    cfg = small_config(action_noise_std=0.05)
    obs = observation_trace(200, seed=9)
    a_gpu = actions(Session(cfg, "cuda"), obs)
    a_np = actions(Session(cfg, "numpy"), obs)
    # fma contraction and the device libm differ from NumPy by ulps; the CPU shim of the same kernels
    # measured 8e-7 over 200 steps. 1e-4 still separates any wrong op (differences ~0.1).
    np.testing.assert_allclose(a_gpu, a_np, rtol=0, atol=1e-4)


def test_cuda_kv_only_restore_diverges_and_full_restore_does_not(gpu):
    obs = observation_trace(300, seed=4)
    actions(gpu, obs[:80])
    cid = gpu.pin(gpu.live_capsule_id).id
    ref = actions(gpu, obs[80:96])
    actions(gpu, obs[96:200])
    gpu.restore_roles(cid, ("kv", "meta"))
    kv_only = actions(gpu, obs[80:96])
    gpu.rollback(cid)
    full = actions(gpu, obs[80:96])
    assert np.abs(kv_only - ref).max() > 1e-3 and np.abs(full - ref).max() == 0.0


def test_cuda_cold_prefill_matches_cold_replay(gpu):
    s = Session(small_config(), "cuda")
    actions(s, observation_trace(150, seed=6))
    replayed = s.state_tensors()  # small state + KV window gathered from the log (page numbers differ)
    s.cold_prefill()
    prefilled = s.state_tensors()
    assert_states_close(prefilled, replayed, atol=5e-4)


# ---- the paged KV log on the device --------------------------------------------------------
def log_config(records: int, log_pages: int, **kw) -> PolicyConfig:
    """A small model whose store holds exactly `records` records and `log_pages` KV log pages."""
    base = small_config(capsule_capacity=records, action_noise_std=0.02, **kw)
    sz = StoreSizes.plan(base)
    return base.replace(capsule_budget_mb=(records * sz.record_nbytes + log_pages * KV_PAGE * sz.entry_nbytes) / 2**20)


def test_cuda_log_wrap_evicts_oldest_and_every_kept_capsule_resumes_byte_exact():
    s = Session(log_config(records=4000, log_pages=20, kv_window=300, max_branches=3), BACKEND)
    assert s.kv.n_pages == 20
    obs = observation_trace(20 * KV_PAGE * 2, seed=11)  # the log wraps twice over
    n = 20 * KV_PAGE * 2
    acts = actions(s, obs[:n])
    u = s.store_usage()
    kept = s.list_capsules()
    assert u.log_entries_used <= 20 * KV_PAGE and u.capsules < n and kept[0].step > 1  # pages ran out, oldest went
    assert [c.step for c in kept] == sorted(c.step for c in kept) and kept[-1].step == n
    live = s.state_host()
    with pytest.raises(UnknownCapsule):
        s.rollback(1)  # evicted: refused, the live state untouched
    assert s.state_host().tobytes() == live.tobytes()
    for cap in (kept[0], kept[len(kept) // 2], kept[-60]):  # each resumed for 40 recorded steps
        s.rollback(cap.id)
        assert s.state_host().tobytes() == s.capsule_host(cap.id).tobytes(), cap.step
        again = actions(s, obs[cap.step:cap.step + 40])
        assert again.tobytes() == acts[cap.step:cap.step + 40].tobytes(), cap.step


@pytest.mark.parametrize("kv_window", [300, 1024])
def test_cuda_window_across_pages_replans_batch_invariant_and_restores_byte_exact(kv_window):
    s = Session(small_config(kv_window=kv_window, action_noise_std=0.02, capsule_capacity=0), BACKEND)
    n = kv_window + 2 * KV_PAGE + 37  # full and wrapped, the head in the middle of a page
    obs = observation_trace(n + 100, seed=kv_window)
    actions(s, obs[:n])
    cid = s.pin(s.live_capsule_id).id
    slab = s.state_host()
    first = actions(s, obs[n:n + 100])  # crosses a page boundary
    plan = np.stack([obs[n:n + 100] + 0.1 * b for b in range(8)]).astype(np.float32)
    wide = s.replan(cid, plan)
    one = s.replan(cid, plan[:1])
    copied = s.replan(cid, plan, copy_fork=True)
    assert one.actions[0].tobytes() == wide.actions[0].tobytes()  # batch invariance
    assert copied.actions.tobytes() == wide.actions.tobytes()  # the shared window reads like a private copy
    for b in (0, 3, 7):
        s.rollback(cid)
        assert actions(s, plan[b]).tobytes() == wide.actions[b].tobytes(), f"branch {b}"
        assert s.state_host().tobytes() == s.capsule_host(wide.branch_capsule_ids[b]).tobytes(), f"branch {b}"
    s.rollback(cid)
    assert s.state_host().tobytes() == slab.tobytes()
    assert actions(s, obs[n:n + 100]).tobytes() == first.tobytes()
    committed = s.replan(cid, plan[:4], commit_branch=2)
    assert s.step_count == n + 100 and s.live_capsule_id == committed.branch_capsule_ids[2]
    assert s.state_host().tobytes() == s.capsule_host(committed.branch_capsule_ids[2]).tobytes()
    assert committed.actions[2].tobytes() == wide.actions[2].tobytes()


def test_cuda_resume_from_the_capsule_log_is_byte_exact_and_continues_identically(tmp_path):
    from flashrt_ros.runtime.persist.writer import PersistSettings

    cfg = small_config(kv_window=300)  # a window of 3 pages, wrapped below
    obs = observation_trace(800)
    s = Session(cfg, "cuda")
    s.enable_persistence(PersistSettings(tmp_path / "log", fsync_every_ms=0.0, segment_mb=1.0, budget_mb=64.0))
    for o in obs[:500]:
        s.step(o)
    s.rollback(steps_back=40)
    for o in obs[500:700]:
        s.step(o)
    s.disable_persistence()
    r = Session(cfg, "cuda")
    report = r.enable_persistence(PersistSettings(tmp_path / "log", fsync_every_ms=0.0, segment_mb=1.0,
                                                  budget_mb=64.0), resume=True)
    assert report.step == s.step_count and r.state_host().tobytes() == s.state_host().tobytes()
    assert actions(r, obs[700:]).tobytes() == actions(s, obs[700:]).tobytes()
