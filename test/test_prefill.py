"""The tuned cold prefill: its attention and GRU scan against textbook float64 references, and the
whole recompute against stepping the history (cold replay) across query chunks, window wraps and the
last layer's head-only rows."""
import numpy as np
import pytest

from conftest import assert_states_close, observation_trace, small_config
from flashrt_ros.runtime import Session
from flashrt_ros.runtime.engine.backend import NumpyBackend
from flashrt_ros.runtime.model.sequence import QUERY_CHUNK, gru_scan
from flashrt_ros.runtime.model.sequence import windowed_attention as _attention


def dense_attention(q, k, v, n_heads, window):
    """Every query t over keys t - window + 1 .. t, one softmax per head, in float64."""
    n, d = q.shape
    hd = d // n_heads
    out = np.zeros((n, d))
    for t in range(n):
        lo = max(0, t - window + 1)
        for h in range(n_heads):
            c = slice(h * hd, (h + 1) * hd)
            s = k[lo:t + 1, c].astype(np.float64) @ q[t, c] / np.sqrt(hd)
            p = np.exp(s - s.max())
            out[t, c] = p @ v[lo:t + 1, c] / p.sum()
    return out


# (n, window, first): one chunk; several chunks with the window inside a chunk, across chunks, longer
# than the history; queries from the middle of a chunk (the last layer's head rows)
ATTENTION_CASES = [(5, 3, 0), (QUERY_CHUNK + 37, 48, 0), (2 * QUERY_CHUNK + 9, 300, 0),
                   (QUERY_CHUNK + 5, 4096, 0), (2 * QUERY_CHUNK + 9, 300, 2 * QUERY_CHUNK - 3), (40, 40, 36)]


@pytest.mark.parametrize("n, window, first", ATTENTION_CASES)
def test_chunked_attention_matches_a_dense_masked_softmax(n, window, first):
    rng = np.random.default_rng(n + window)
    H, d = 4, 32
    q, k, v = (rng.standard_normal((n, d)).astype(np.float32) * 2 for _ in range(3))
    got = _attention(np, q, k, v, H, window, first)
    assert got.shape == (n - first, d)
    np.testing.assert_allclose(got, dense_attention(q, k, v, H, window)[first:], rtol=0, atol=2e-5)


@pytest.mark.parametrize("n, H", [(1, 8), (300, 33), (64, 128)])
def test_numpy_gru_scan_matches_the_textbook_recurrence(n, H):
    rng = np.random.default_rng(n * H)
    gi = rng.standard_normal((n, 3 * H)).astype(np.float32)
    w_hh = (rng.standard_normal((H, 3 * H)) / np.sqrt(H)).astype(np.float32)
    b_hh = rng.standard_normal(3 * H).astype(np.float32)
    h, want = np.zeros(H), np.zeros((n, H))
    for t in range(n):  # PyTorch gate order (r, z, n), float64
        gh = h @ w_hh + b_hh
        r = 1 / (1 + np.exp(-(gi[t, :H] + gh[:H])))
        z = 1 / (1 + np.exp(-(gi[t, H:2 * H] + gh[H:2 * H])))
        nn = np.tanh(gi[t, 2 * H:] + r * gh[2 * H:])
        h = want[t] = (1 - z) * nn + z * h
    got = gru_scan(NumpyBackend(), gi, w_hh, b_hh)
    assert got.shape == (n, H) and got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)


# (config, n): window inside one query chunk, wrapped many times over several chunks; a window longer
# than a chunk, partly filled and wrapped; the default model's width with a 256-entry window
PREFILL_CASES = [(dict(kv_window=48), 600), (dict(kv_window=300), 299), (dict(kv_window=300), 700),
                 (dict(kv_window=256, d_model=128, n_layers=4, n_heads=4, chunk_len=8), 2 * QUERY_CHUNK + 77)]


@pytest.mark.parametrize("mixer", ["gru", "ssm"])
@pytest.mark.parametrize("kw, n", PREFILL_CASES)
def test_cold_prefill_matches_stepping_across_chunks_and_window_wraps(kw, n, mixer):
    s = Session(small_config(mixer=mixer, **kw))
    obs = observation_trace(n)
    for o in obs:
        s.step(o)
    stepped = s.state_tensors()
    s.cold_prefill()
    # GEMM vs GEMV order and tanh- vs exp-sigmoid only: a few ulps of O(1) values. The residual stream that
    # conv_state keeps reaches |x| ~ 45 at d_model 128; the SSM's sequence form sums its states in another
    # order than its step (h @ C vs s = 0..N-1), which doubles the difference there (5.6e-7 of |x|)
    assert_states_close(s.state_tensors(), stepped, atol=2e-5 if mixer == "gru" else 4e-5)


def test_step_plan_and_prefill_walk_the_one_network_description(monkeypatch):
    """model/network.py is the only description: the plan's ops and prefill's sequence forms come from the same
    (op, layer) walk, in the same order."""
    from flashrt_ros.runtime.model import network as model

    stepped, sequenced = [], []
    for cls in {type(op) for op, _ in model.walk(small_config())}:
        step, sequence = cls.step, cls.sequence
        monkeypatch.setattr(cls, "step", lambda self, plan, cfg, layer, f=step: (
            stepped.append((type(self).__name__, layer)), f(self, plan, cfg, layer))[1])
        monkeypatch.setattr(cls, "sequence", lambda self, seq, x, layer, f=sequence: (
            sequenced.append((type(self).__name__, layer)), f(self, seq, x, layer))[1])
    s = Session(small_config(n_layers=3))
    assert stepped == list((type(op).__name__, layer) for op, layer in model.walk(s.cfg))
    s.prefill_from(observation_trace(20))
    assert sequenced == stepped
    assert {"Gru", "Attention", "CausalConv", "Mlp"} <= {name for name, _ in stepped}
