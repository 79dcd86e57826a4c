"""The capture-discipline mode passes the real plan and catches what a CUDA capture would reject."""
import dataclasses

import numpy as np
import pytest

from conftest import observation_trace, small_config
from flashrt_ros.runtime import Session
from flashrt_ros.runtime.engine import launch_table as launch_mod
from flashrt_ros.runtime.engine.capture_check import CaptureCheckBackend, CaptureViolation
from flashrt_ros.runtime.model.kernels import KV_PAGE, META_KV_LEN, META_RNG, REGISTRY, window_pages


def checked_session(**kw):
    kw.setdefault("action_noise_std", 0.05)  # the noise op too: its counter must come from meta, not an argument
    return Session(small_config(**kw), CaptureCheckBackend())


@pytest.mark.parametrize("kv_window, mixer", [(48, "gru"), (300, "gru"), (1024, "gru"), (300, "ssm")])
def test_real_plan_passes_capture_discipline_through_steps_rollbacks_and_replans(kv_window, mixer):
    s = checked_session(kv_window=kv_window, mixer=mixer)
    assert any(op.kernel == "rng_noise" for op in s.plan.ops)
    n = window_pages(kv_window) * KV_PAGE + 20  # past the wrap of the page ring: several attention splits
    obs = observation_trace(n + 20)
    for o in obs[:n]:
        s.step(o)
    s.rollback(steps_back=30)
    s.replan(0, np.stack([obs[n:n + 10]] * 3))
    s.replan(0, np.stack([obs[n:n + 4]] * 8), commit_branch=2)


def test_changing_scalar_argument_is_caught(monkeypatch):
    real = launch_mod.LAUNCHERS["attn_decode"]

    def bakes_in_kv_len(qkv, k_log, v_log, meta, *rest, n_heads, kv_window):
        partial, combine = real(qkv, k_log, v_log, meta, *rest, n_heads=n_heads, kv_window=kv_window)
        T = np.int32(min(int(meta[0, META_KV_LEN]) + 1, kv_window))  # read at launch: frozen by a graph
        return dataclasses.replace(partial, args=partial.args + (T,)), combine

    monkeypatch.setitem(launch_mod.LAUNCHERS, "attn_decode", bakes_in_kv_len)
    s = checked_session()
    with pytest.raises(CaptureViolation, match="changing scalar"):
        s.step(np.zeros(14, np.float32))


def test_buffer_address_change_is_caught():
    s = checked_session()
    s.step(np.zeros(14, np.float32))
    s.arena.views["xn"] = np.zeros_like(s.arena.views["xn"])  # rebinding a name: the graph keeps the old one
    with pytest.raises(CaptureViolation, match="buffer address changed"):
        s.step(np.zeros(14, np.float32))


def test_allocation_during_replay_is_caught(monkeypatch):
    add = REGISTRY["add"]

    def allocating_add(x, y):
        x += np.ascontiguousarray(y) + np.zeros(1 << 16, np.float32)[: y.shape[-1]]

    monkeypatch.setitem(REGISTRY, "add", dataclasses.replace(add, ref=allocating_add))
    s = checked_session()
    with pytest.raises(CaptureViolation, match="allocation during replay"):
        s.step(np.zeros(14, np.float32))


def test_host_sync_during_replay_is_caught(monkeypatch):
    s = checked_session()
    add = REGISTRY["add"]

    def syncing_add(x, y):
        if s.backend.to_host(y).any():  # a .get() inside the step
            x += y

    monkeypatch.setitem(REGISTRY, "add", dataclasses.replace(add, ref=syncing_add))
    s2 = Session(small_config(), s.backend)
    with pytest.raises(CaptureViolation, match="host sync"):
        s2.step(np.zeros(14, np.float32))


def test_noise_seed_that_varies_per_step_is_caught(monkeypatch):
    real = launch_mod.LAUNCHERS["rng_noise"]

    def counter_as_seed(action, meta, seed, std):  # reads the step counter on the host: frozen by a graph
        return real(action, meta, seed + int(meta[0, META_RNG]), std)

    monkeypatch.setitem(launch_mod.LAUNCHERS, "rng_noise", counter_as_seed)
    s = checked_session()
    with pytest.raises(CaptureViolation, match="changing scalar"):
        s.step(np.zeros(14, np.float32))
