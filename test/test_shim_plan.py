"""The whole policy step as CUDA C kernels on the CPU (the shim backend) against the NumPy backend."""
import numpy as np
import pytest
from cuda_on_cpu.shim_backend import ShimBackend

from conftest import assert_states_close, observation_trace, small_config
from flashrt_ros.runtime import Session
from flashrt_ros.runtime.model.kernels import KV_PAGE, window_pages


@pytest.fixture(scope="module", params=["gru", "ssm"])
def runs(request):
    cfg = small_config(action_noise_std=0.05, seed=3, mixer=request.param)
    obs = observation_trace(230, seed=5)
    shim, ref = Session(cfg, ShimBackend()), Session(cfg, "numpy")
    a_shim = np.stack([shim.step(o).action for o in obs[:200]])
    a_ref = np.stack([ref.step(o).action for o in obs[:200]])
    return shim, ref, obs, a_shim, a_ref


def test_shim_plan_matches_numpy_over_200_steps(runs):
    shim, ref, _, a_shim, a_ref = runs
    # summation order and libm differ; measured max |diff| 8e-7 over 200 steps (actions ~0.3): 1e-5 leaves
    # headroom for recurrent amplification while a wrong op or stride gives differences of order 0.1
    np.testing.assert_allclose(a_shim, a_ref, rtol=0, atol=1e-5)
    assert_states_close(shim.state_tensors(), ref.state_tensors(), atol=2e-5)  # KV window gathered from the log


def test_shim_prefill_runs_the_sequence_kernels_and_matches_numpy_prefill(runs):
    """Cold prefill through the shim launches the mixer's sequence kernel (gru_scan_f32, ssm_scan_f32) as
    CUDA would."""
    shim, ref, _, _, _ = runs
    shim_state, ref_state = {}, {}
    for s, out in ((shim, shim_state), (ref, ref_state)):
        cid = s.pin(s.live_capsule_id).id
        s.cold_prefill()
        out.update(s.state_tensors())
        s.rollback(cid)
    assert_states_close(shim_state, ref_state, atol=2e-5)


def test_shim_restore_is_byte_exact_against_itself(runs):
    shim, _, obs, _, _ = runs
    cid = shim.pin(shim.live_capsule_id).id
    first = np.stack([shim.step(o).action for o in obs[200:215]])
    shim.replan(0, np.ones((3, 4, 14), np.float32))  # dirty the branch rows too
    shim.rollback(cid)
    again = np.stack([shim.step(o).action for o in obs[200:215]])
    assert first.tobytes() == again.tobytes()


def test_shim_replan_branches_equal_shim_live_stepping(runs):
    shim, _, obs, _, _ = runs
    cid = shim.pin(shim.live_capsule_id).id
    branches = np.stack([obs[200:206], obs[210:216], obs[220:226]])
    res = shim.replan(cid, branches, deadline_ms=1e6)
    for b in range(3):
        shim.rollback(cid)
        live = np.stack([shim.step(o).action for o in branches[b]])
        assert live.tobytes() == res.actions[b].tobytes()


@pytest.mark.parametrize("mixer", ["gru", "ssm"])
@pytest.mark.parametrize("kv_window", [300, 1024])
def test_shim_plan_matches_numpy_past_the_page_ring_wrap(kv_window, mixer, tmp_path):
    """A window of several attention splits, after the page ring wrapped: the NumPy session runs the
    long prefix, the shim session imports its capsule and both continue across a page boundary; then
    the shim's replan branches must equal the shim's own live stepping byte for byte."""
    cfg = small_config(kv_window=kv_window, max_branches=3, action_noise_std=0.05, seed=3, mixer=mixer)
    ring = window_pages(kv_window) * KV_PAGE
    obs = observation_trace(ring + 160, seed=7)
    start = ring + 120  # 8 steps before a page boundary
    ref = Session(cfg, "numpy")
    for o in obs[:start]:
        ref.step(o)
    ref.export_capsule(0, tmp_path / "c.safetensors")
    shim = Session(cfg, ShimBackend())
    shim.import_capsule(tmp_path / "c.safetensors", restore=True)
    a_ref = np.stack([ref.step(o).action for o in obs[start:start + 12]])
    a_shim = np.stack([shim.step(o).action for o in obs[start:start + 12]])
    np.testing.assert_allclose(a_shim, a_ref, rtol=0, atol=1e-5)
    assert_states_close(shim.state_tensors(), ref.state_tensors(), atol=2e-5)
    cid = shim.pin(shim.live_capsule_id).id
    branches = np.stack([obs[start + 12 + 3 * b:start + 17 + 3 * b] for b in range(3)])
    res = shim.replan(cid, branches)
    for b in range(3):
        shim.rollback(cid)
        live = np.stack([shim.step(o).action for o in branches[b]])
        assert live.tobytes() == res.actions[b].tobytes(), f"branch {b}"
