"""Plan table, allocation-free replay, config file, weights."""
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
import yaml

from conftest import ROOT, small_config
from flashrt_ros.runtime import PolicyConfig, Session
from flashrt_ros.runtime.model.buffers import SMALL_ROLES, STATE_ROLES
from flashrt_ros.runtime.model.kernels import REGISTRY
from flashrt_ros.runtime.model.weights import WeightsError


def _per_op_peak_bytes(d_model: int, n_heads: int) -> dict[str, int]:
    """Largest transient memory (tracemalloc peak) of each kernel twin over a few replays. The window
    (17 pages) keeps the attention scratch above NumPy's 8192-element iterator buffer at both sizes,
    so that constant buffer does not count as growth."""
    s = Session(small_config(d_model=d_model, n_heads=n_heads, n_layers=1, kv_window=2000, action_noise_std=0.1,
                             max_branches=1, capsule_budget_mb=64))
    for _ in range(140):  # past a page boundary: the window spans two pages
        s.step(np.ones(14, np.float32))
    worst: dict[str, int] = {}
    tracemalloc.start()
    try:
        for _ in range(3):
            for fn, views, consts in s._live.calls:
                before, _ = tracemalloc.get_traced_memory()
                tracemalloc.reset_peak()
                with np.errstate(over="ignore"):
                    fn(*views, **consts)
                peak = tracemalloc.get_traced_memory()[1] - before
                worst[fn.__name__] = max(worst.get(fn.__name__, 0), peak)
    finally:
        tracemalloc.stop()
    return worst


def test_replay_allocates_no_arrays_whatever_the_model_size():
    # Views cost a few hundred bytes of Python objects whatever the sizes; an array allocated per step
    # grows with them (at d_model 1024 a single [1, d] temporary is 4 KiB), and a CUDA graph could not
    # allocate it at all. So the transient memory of every twin must not grow with the model.
    small, large = _per_op_peak_bytes(256, 4), _per_op_peak_bytes(1024, 16)
    grown = {k: large[k] - small[k] for k in small if large[k] - small[k] > 1024}
    assert not grown, f"twins allocate per step (bytes grown from d_model 256 to 1024): {grown}"
    assert max(large.values()) < 64 * 1024


def test_describe_lists_every_op_with_reads_and_writes(session):
    text = session.plan.describe()
    lines = text.splitlines()
    assert lines[0].split() == ["#", "op", "kernel", "reads", "writes"]
    assert len(lines) == 1 + len(session.plan.ops)
    assert "L1.attn" in text and "k_log.1" in text and lines[-1].split()[1] == "meta_advance"
    assert all(op.kernel in REGISTRY for op in session.plan.ops)


def test_small_state_roles_share_one_contiguous_slab_and_kv_lives_in_the_shared_log(session):
    arena = session.arena
    assert {s.role for s in arena.state_specs()} == set(SMALL_ROLES)
    for spec in arena.state_specs():
        view = arena[spec.name]
        assert np.shares_memory(view, arena.state)
        assert view.strides[0] == arena.row_nbytes
    assert arena.state_bytes(0).flags.c_contiguous and arena.state_bytes(0).nbytes == arena.row_nbytes
    logs = [s for s in arena.specs if s.role == "kv"]
    assert logs and all(np.shares_memory(arena[s.name], arena.log_slab) for s in logs)
    assert {s.role for s in session.policy.window_specs()} == set(STATE_ROLES)  # the closed set, materialised
    assert arena.row_nbytes < 16 * 1024  # a capsule's own bytes do not grow with the window


def test_live_buffers_never_move(session, trace):
    addrs = {n: v.__array_interface__["data"][0] for n, v in session.arena.views.items()}
    for o in trace[:5]:
        session.step(o)
    session.rollback(2)
    session.replan(0, trace[None, :3])
    session.cold_prefill()
    assert addrs == {n: v.__array_interface__["data"][0] for n, v in session.arena.views.items()}


def test_config_file_matches_dataclass_defaults():
    cfg = PolicyConfig.from_yaml(ROOT / "config" / "flashrt.yaml")
    assert cfg == PolicyConfig()
    params = yaml.safe_load((ROOT / "config" / "flashrt.yaml").read_text())["/**"]["ros__parameters"]
    assert set(PolicyConfig.field_help()) <= set(params), "every field is in the shipped config"


def test_config_from_yaml_rejects_bad_layout(tmp_path: Path):
    p = tmp_path / "bad.yaml"
    p.write_text("flashrt:\n  d_model: 3\n")
    with pytest.raises(ValueError, match="ros__parameters"):
        PolicyConfig.from_yaml(p)
    p.write_text("/**:\n  ros__parameters:\n    d_model: 30\n    n_heads: 4\n")
    with pytest.raises(ValueError, match="n_heads"):
        PolicyConfig.from_yaml(p)


def test_weights_round_trip_and_strict_loading(tmp_path):
    s = Session(small_config(seed=3))
    s.save_policy(tmp_path / "w.safetensors")
    loaded = Session(small_config(seed=3, weights_path=str(tmp_path / "w.safetensors")))
    assert loaded.fingerprint == Session(small_config(seed=3)).fingerprint
    from safetensors.numpy import load_file, save_file
    w = load_file(str(tmp_path / "w.safetensors"))
    w["head.b"] = w["head.b"][:-1]
    save_file(w, str(tmp_path / "short.safetensors"))
    with pytest.raises(WeightsError, match="head.b"):
        Session(small_config(weights_path=str(tmp_path / "short.safetensors")))
    with pytest.raises(WeightsError, match="cannot open"):
        Session(small_config(weights_path=str(tmp_path / "nope.safetensors")))


def test_fingerprint_changes_with_weights_and_config_but_not_capsule_settings():
    base = Session(small_config()).fingerprint
    assert Session(small_config(seed=1)).fingerprint != base
    assert Session(small_config(kv_window=40)).fingerprint != base
    assert Session(small_config(capsule_capacity=10)).fingerprint == base


def test_backend_auto_takes_cuda_when_usable_and_an_unknown_backend_is_refused():
    from flashrt_ros.runtime.engine.backend import cuda_probe, select
    assert select("auto").name == ("cuda" if cuda_probe() is None else "cpu")
    with pytest.raises(ValueError, match="backend: expected auto, numpy, cpu or cuda"):
        select("tpu")


def test_backend_auto_falls_back_to_cpu_then_numpy_and_cuda_fails_loudly_without_a_device(tmp_path):
    """On every machine, a GPU one too: a process where CuPy cannot be imported, as on a robot without it."""
    import os
    import subprocess
    import sys

    from ros_harness import env_without_module
    code = ("from flashrt_ros.runtime import Session\n"
            "from flashrt_ros.runtime.engine.backend import BackendUnavailable, select\n"
            "from conftest import small_config\n"
            "assert select('auto').name == 'cpu'\n"
            "try:\n    Session(small_config(), 'cuda')\nexcept BackendUnavailable as e:\n    print(e)\n")
    env = env_without_module(dict(os.environ, PYTHONPATH=f"{ROOT / 'test'}{os.pathsep}{ROOT}"), tmp_path / "shim",
                             "cupy")
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.startswith("backend 'cuda' requested but unavailable: cupy is not importable")
    no_numba = env_without_module(env, tmp_path / "shim2", "numba")  # neither cupy nor numba: the reference
    (tmp_path / "shim2" / "sitecustomize.py").write_text(
        "import sys\nsys.modules['numba'] = sys.modules['cupy'] = None\n")
    res = subprocess.run([sys.executable, "-c", "from flashrt_ros.runtime.engine.backend import select\n"
                          "assert select('auto').name == 'numpy'"], cwd=ROOT, env=no_numba, capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]


def test_config_is_frozen_so_an_invalid_value_cannot_sneak_in_after_validation():
    import dataclasses

    cfg = PolicyConfig()
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.kv_window = -5
    with pytest.raises(ValueError, match="kv_window"):
        cfg.replace(kv_window=-5)
    assert cfg.replace(capsule_budget_mb=512).capsule_budget_mb == 512.0  # int for float is coerced


def test_yaml_typo_is_an_error_naming_the_key_and_the_nearest_field(tmp_path):
    p = tmp_path / "p.yaml"
    p.write_text("/**:\n  ros__parameters:\n    kv_windw: 64\n    backend: numpy\n")
    with pytest.raises(ValueError, match="kv_windw.*did you mean 'kv_window'"):
        PolicyConfig.from_yaml(p)
    p.write_text("/**:\n  ros__parameters:\n    kv_window: 64\n    backend: numpy\n")
    assert PolicyConfig.from_yaml(p).kv_window == 64  # node parameters are not typos
