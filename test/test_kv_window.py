"""KvLog.window: a whole window copied by runs of positions (one page, one lap of the ring) holds exactly the
bytes of the position-by-position gather, for partial, full and wrapped windows, page tables out of order
(after rollbacks and copy-on-writes), and windows that are not a multiple of the page."""
import numpy as np
import pytest

from conftest import CPU_BACKENDS, observation_trace, small_config
from flashrt_ros.runtime import Session
from flashrt_ros.runtime.model.kernels import KV_PAGE


def _windows_agree(s: Session, pages, pos: int) -> None:
    W = s.cfg.kv_window
    kv_len = min(pos, W)
    by_runs = s.kv.window(pages, pos, kv_len, W)
    by_position = np.stack([np.stack(pair) for pair in s.kv.gather_positions(pages, pos, kv_len, W)])
    assert by_runs.shape == (s.cfg.n_layers, 2, W, s.cfg.d_model)
    assert by_runs.tobytes() == by_position.tobytes()
    gathered = s.kv.gather(pages, pos, kv_len, W)
    assert np.stack([np.stack(pair) for pair in gathered]).tobytes() == by_position.tobytes()


@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize("kv_window, steps", [
    (48, 30),  # part of one page: zeros after it
    (200, 200),  # exactly full, not a multiple of the page
    (200, 391),  # wrapped, the ring's lap ending mid-page
    (2 * KV_PAGE, 2 * KV_PAGE + 5),  # wrapped by a few entries: the first page is split across the ring's end
    (3 * KV_PAGE, 7 * KV_PAGE),  # wrapped on a page boundary
])
def test_a_window_copied_by_page_runs_equals_the_gather_of_every_position(backend, kv_window, steps):
    s = Session(small_config(kv_window=kv_window), backend)
    obs = observation_trace(steps + 40, s.cfg.obs_dim, seed=5)
    for o in obs[:steps]:
        s.step(o)
    _windows_agree(s, s.kv.tables[0], steps)
    # a rollback and a few steps: the live row's last page is a copy-on-write, its table out of order
    s.rollback(steps_back=min(steps - 1, 7))
    for o in obs[steps:steps + 3]:
        s.step(o)
    _windows_agree(s, s.kv.tables[0], s.step_count)
    for info in s.list_capsules()[-5:]:  # capsules' own tables, older positions
        _windows_agree(s, s.store.pages_of(info.id), info.step)


def test_an_empty_window_is_all_zeros():
    s = Session(small_config(), "numpy")
    assert not s.kv.window(s.kv.tables[0], 0, 0, s.cfg.kv_window).any()


@pytest.mark.parametrize("bad", ["shape", "dtype", "strides"])
def test_a_window_into_a_wrong_buffer_is_refused_and_the_buffer_left_untouched(bad):
    s = Session(small_config(), "numpy")
    for o in observation_trace(20, s.cfg.obs_dim):
        s.step(o)
    L, W, d = s.cfg.n_layers, s.cfg.kv_window, s.cfg.d_model
    out = {"shape": np.full((L, 2, W + 1, d), 7.0, np.float32), "dtype": np.full((L, 2, W, d), 7.0, np.float64),
           "strides": np.full((L, 2, d, W), 7.0, np.float32).transpose(0, 1, 3, 2)}[bad]
    before = out.tobytes()
    with pytest.raises(ValueError, match="out must be"):
        s.kv.window(s.kv.tables[0], 20, 20, W, out)
    assert out.tobytes() == before
