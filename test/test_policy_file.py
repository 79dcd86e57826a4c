"""The policy file (runtime/model/policy_file.py): the architecture travels with the tensors and is checked,
16-bit tensors widen exactly, every error names the file and the tensor, and the actions reach the robot's
units (action_scale / action_offset) on every CPU backend, with either chunk blend."""
from __future__ import annotations

import json
import logging
import os
import struct

import numpy as np
import pytest

from conftest import CPU_BACKENDS, observation_trace, small_config
from flashrt_ros.runtime import PolicyConfig, Session
from flashrt_ros.runtime.model.policy import HybridPolicy
from flashrt_ros.runtime.model.policy_file import (
    ARCH_FIELDS,
    config_from_policy,
    read_policy,
    save_policy,
)
from flashrt_ros.runtime.model.weights import WeightsError


def write_safetensors(path, tensors: dict[str, tuple[str, np.ndarray]], metadata: dict | None = None) -> None:
    """A safetensors file by hand: {name: (dtype tag, raw array)}, so any dtype (BF16, F64) can be written."""
    header, blobs, at = {}, [], 0
    for name, (tag, arr) in tensors.items():
        raw = np.ascontiguousarray(arr).tobytes()
        header[name] = {"dtype": tag, "shape": list(arr.shape), "data_offsets": [at, at + len(raw)]}
        blobs.append(raw)
        at += len(raw)
    if metadata is not None:
        header["__metadata__"] = metadata
    head = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(head)) + head + b"".join(blobs))


def file_metadata(path) -> dict:
    blob = path.read_bytes()
    (n,) = struct.unpack("<Q", blob[:8])
    return json.loads(blob[8:8 + n])["__metadata__"]


def trained_like_weights(cfg: PolicyConfig, seed: int = 1) -> dict[str, np.ndarray]:
    """Seeded weights moved off bf16 values (as a float32 training run leaves them), with robot units."""
    w = Session(cfg).weights
    rng = np.random.default_rng(seed)
    out = {k: (v * (1 + 1e-3 * rng.standard_normal(v.shape))).astype(np.float32) for k, v in w.items()
           if not k.startswith("const.")}
    out["action_scale"] = (0.5 + 3 * rng.random(cfg.action_dim)).astype(np.float32)
    out["action_offset"] = rng.standard_normal(cfg.action_dim).astype(np.float32)
    return out


def test_a_saved_policy_reads_back_byte_identical_with_its_architecture_and_channel_names(tmp_path):
    cfg = small_config()
    w = trained_like_weights(cfg)
    names = [f"j{i}" for i in range(7)]
    save_policy(tmp_path / "p.safetensors", cfg, w, obs_names=names + [n + "_vel" for n in names],
                action_names=names)
    pf = read_policy(tmp_path / "p.safetensors")
    assert pf.arch == {f: getattr(cfg, f) for f in ARCH_FIELDS}
    assert pf.obs_names[7] == "j0_vel" and pf.action_names == tuple(names)
    assert set(pf.tensors) == set(w)
    for k in w:
        assert pf.tensors[k].tobytes() == w[k].tobytes(), k
    meta = file_metadata(tmp_path / "p.safetensors")
    assert meta["format"] == "flashrt-policy" and meta["matrix_layout"] == "in_out"


def test_the_same_weights_save_to_the_same_bytes_that_the_safetensors_library_reads(tmp_path):
    from safetensors.numpy import load_file  # the reference reader
    cfg, w = small_config(), trained_like_weights(small_config())
    names = [f"j{i}" for i in range(7)]
    blobs = set()
    for i in range(6):  # safetensors' own writer gave 6 different files for 6 saves (its metadata map's order)
        save_policy(tmp_path / f"p{i}.safetensors", cfg, w, obs_names=names * 2, action_names=names)
        blobs.add((tmp_path / f"p{i}.safetensors").read_bytes())
    assert len(blobs) == 1
    (n,) = struct.unpack("<Q", next(iter(blobs))[:8])
    assert n % 8 == 0  # the data starts 8-byte aligned, as safetensors writes it
    loaded = load_file(str(tmp_path / "p0.safetensors"))
    assert set(loaded) == set(w) and all(loaded[k].tobytes() == w[k].tobytes() for k in w)


@pytest.mark.parametrize("field, value", [("n_heads", 4), ("kv_window", 64), ("chunk_blend", "oldest"),
                                          ("chunk_blend_decay", 0.01), ("mixer", "ssm")])
def test_a_file_of_another_architecture_is_refused_naming_the_field_and_both_values(tmp_path, field, value):
    """n_heads, kv_window and the blend change no shape: only the metadata can tell (measured: such files ran)."""
    made_for = small_config(**{field: value})
    save_policy(tmp_path / "p.safetensors", made_for, Session(made_for).weights)
    want = getattr(small_config(), field)
    with pytest.raises(WeightsError, match=rf"p.safetensors.*{field} is {value!r} in the file, {want!r} in the "
                                           "config"):
        Session(small_config(weights_path=str(tmp_path / "p.safetensors")))


def test_a_file_for_another_chunk_and_action_size_is_refused_before_its_shapes(tmp_path):
    made_for = small_config(chunk_len=7, action_dim=8)
    save_policy(tmp_path / "p.safetensors", made_for, Session(made_for).weights)
    with pytest.raises(WeightsError, match="action_dim is 8 in the file, 7 in the config"):
        Session(small_config(weights_path=str(tmp_path / "p.safetensors")))


def test_a_bare_safetensors_file_loads_with_a_warning_and_identity_units(tmp_path, caplog):
    cfg = small_config()
    ref = Session(cfg)
    bare = {k: ("F32", v) for k, v in ref.weights.items()
            if not k.startswith("const.") and k not in ("action_scale", "action_offset")}
    write_safetensors(tmp_path / "bare.safetensors", bare)
    with caplog.at_level(logging.WARNING, logger="flashrt_ros.runtime"):
        s = Session(cfg.replace(weights_path=str(tmp_path / "bare.safetensors")))
    assert "architecture could not be checked" in caplog.text
    assert s.fingerprint == ref.fingerprint  # scale 1 and offset 0 filled in: the same policy
    obs = observation_trace(20)
    for o in obs:
        assert s.step(o).action.tobytes() == ref.step(o).action.tobytes()


@pytest.mark.parametrize("tag", ["BF16", "F16"])
def test_sixteen_bit_tensors_widen_to_float32_exactly(tmp_path, tag):
    cfg = small_config()
    w = trained_like_weights(cfg)
    if tag == "BF16":  # bf16 is the upper half of a float32: truncate to get one
        stored = {k: (v.view(np.uint32) >> 16).astype(np.uint16) for k, v in w.items()}
        widened = {k: (s.astype(np.uint32) << 16).view(np.float32) for k, s in stored.items()}
    else:
        stored = {k: v.astype(np.float16) for k, v in w.items()}
        widened = {k: s.astype(np.float32) for k, s in stored.items()}
    save_policy(tmp_path / "f32.safetensors", cfg, w)
    meta = file_metadata(tmp_path / "f32.safetensors")
    write_safetensors(tmp_path / "p16.safetensors", {k: (tag, v) for k, v in stored.items()}, meta)
    s = Session(cfg.replace(weights_path=str(tmp_path / "p16.safetensors")))
    for k, v in widened.items():
        assert s.weights[k].dtype == np.float32 and s.weights[k].tobytes() == v.tobytes(), k


def test_policy_path_makes_the_files_architecture_the_config(tmp_path):
    made_for = small_config(d_model=48, n_heads=3, chunk_len=5, kv_window=40, chunk_blend="oldest",
                            chunk_blend_decay=0.01)
    save_policy(tmp_path / "p.safetensors", made_for, trained_like_weights(made_for))
    s = Session(PolicyConfig(policy_path=str(tmp_path / "p.safetensors"), capsule_budget_mb=64.0))
    assert {f: getattr(s.cfg, f) for f in ARCH_FIELDS} == {f: getattr(made_for, f) for f in ARCH_FIELDS}
    assert config_from_policy(tmp_path / "p.safetensors").d_model == 48
    with pytest.raises(WeightsError, match="d_model is 48 in the file and 64 in the config"):
        Session(PolicyConfig(policy_path=str(tmp_path / "p.safetensors"), d_model=64))
    with pytest.raises(ValueError, match="either policy_path"):
        PolicyConfig(policy_path="a", weights_path="b")


@pytest.mark.parametrize("damage, match", [
    (lambda h: h["head.b"].update(dtype="F64"), "tensor head.b: float64"),
    (lambda h: h["head.w"].update(dtype="I32"), "tensor head.w: dtype 'I32' is not a float"),
    (lambda h: h["in_proj.b"].update(data_offsets=[0, 10**9]), "tensor in_proj.b: data_offsets"),
    (lambda h: h["__metadata__"].update(format_version="2"), "format_version '2'"),
    (lambda h: h["__metadata__"].update(matrix_layout="out_in"), "matrix_layout 'out_in'"),
    (lambda h: h["__metadata__"].update(architecture="[1]"), "architecture: expected a JSON dict"),
])
def test_a_damaged_file_is_refused_naming_the_file_and_the_tensor(tmp_path, damage, match):
    cfg = small_config()
    save_policy(tmp_path / "p.safetensors", cfg, Session(cfg).weights)
    blob = (tmp_path / "p.safetensors").read_bytes()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n])
    damage(header)
    head = json.dumps(header).encode()
    (tmp_path / "bad.safetensors").write_bytes(struct.pack("<Q", len(head)) + head + blob[8 + n:])
    with pytest.raises(WeightsError, match=f"bad.safetensors: .*{match}"):
        Session(cfg.replace(weights_path=str(tmp_path / "bad.safetensors")))


def test_a_fifo_or_a_directory_is_refused_without_blocking(tmp_path):
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(WeightsError, match="fifo: not a regular file"):
        read_policy(tmp_path / "fifo")
    with pytest.raises(WeightsError, match="not a regular file|cannot open"):
        read_policy(tmp_path)


@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize("blend", ["newest", "oldest"])
def test_actions_are_the_blend_in_the_robots_units_on_every_cpu_backend(tmp_path, backend, blend):
    """action = blend * action_scale + action_offset, to the byte: the same session with identity units gives
    the blend, and float32 numpy maps it the way every kernel must."""
    cfg = small_config(chunk_blend=blend, chunk_blend_decay=0.01 if blend == "oldest" else 0.25)
    w = trained_like_weights(cfg)
    identity = dict(w, action_scale=np.ones(cfg.action_dim, np.float32),
                    action_offset=np.zeros(cfg.action_dim, np.float32))
    save_policy(tmp_path / "units.safetensors", cfg, w)
    robot = Session(cfg.replace(weights_path=str(tmp_path / "units.safetensors")), backend=backend)
    blended = Session(cfg, backend=backend, weights=identity)
    for o in observation_trace(60):
        got, base = robot.step(o).action, blended.step(o).action
        assert got.tobytes() == (base * w["action_scale"] + w["action_offset"]).tobytes()
    assert np.abs(got).max() > 1.0  # past tanh's (-1, 1): the robot's units are reachable


def test_the_oldest_blend_weighs_the_oldest_pending_prediction_most():
    """ACT's temporal ensemble: with a large decay the blend is (nearly) the oldest chunk's prediction."""
    K, A = 4, 7
    s = Session(small_config(chunk_blend="oldest", chunk_blend_decay=20.0))
    chunks = []
    for t, o in enumerate(observation_trace(12)):
        r = s.step(o)
        chunks.append(r.chunk.reshape(K, A))
        if t >= K - 1:
            oldest = chunks[t - (K - 1)][K - 1]  # predicted K-1 steps ago for this step
            np.testing.assert_allclose(r.action, oldest, atol=1e-6)
            assert not np.allclose(r.action, chunks[t][0], atol=1e-4)


def test_a_replan_branch_acts_in_the_robots_units_like_the_live_policy(tmp_path):
    cfg = small_config()
    w = trained_like_weights(cfg)
    save_policy(tmp_path / "p.safetensors", cfg, w)
    s = Session(cfg.replace(weights_path=str(tmp_path / "p.safetensors")), backend="cpu")
    obs = observation_trace(40)
    cap = [s.step(o) for o in obs[:20]][-1].capsule_id
    live = np.stack([s.step(o).action for o in obs[20:28]])
    res = s.replan(cap, np.stack([obs[20:28], obs[20:28] + 0.5]))
    assert res.actions[0].tobytes() == live.tobytes()
    assert not np.array_equal(res.actions[1], live)


def test_the_documented_weight_table_is_the_codes():
    """docs/policy.md's table (layer 0 of the default config, both mixers) is what the op list declares."""
    from pathlib import Path
    text = (Path(__file__).resolve().parents[1] / "docs" / "policy.md").read_text()
    table = text.split("<!-- weight table -->")[1].split("<!-- end of weight table -->")[0]
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in table.strip().splitlines()[2:]]
    documented = [(name.strip("`"), shape, mixer) for name, shape, mixer in rows]
    declared = {}
    for mixer in ("gru", "ssm"):
        for s in HybridPolicy(PolicyConfig(mixer=mixer)).weight_specs():
            if s.name.startswith("const.") or (s.name.startswith("layers.") and not s.name.startswith("layers.0.")):
                continue
            declared.setdefault(s.name, (f"[{', '.join(map(str, s.shape))}]", set()))[1].add(mixer)
    want = [(n, shape, "" if len(m) == 2 else m.pop()) for n, (shape, m) in declared.items()]
    assert sorted(documented) == sorted(want) and len(documented) == len(want)


def test_flashrt_replay_runs_a_policy_file_given_as_policy_path_alone(tmp_path):
    """The ROS-free replay takes the file's sizes too (obs_dim before the Session exists), and its actions
    are the file's policy's."""
    from fixtures.make_bags import write_joint_bag
    from fixtures.replay_cli import TINY_CONFIG, config_with, replay

    made_for = PolicyConfig(d_model=16, n_layers=1, n_heads=2, kv_window=8, chunk_len=3, conv_kernel=2)
    save_policy(tmp_path / "p.safetensors", made_for, trained_like_weights(made_for))
    base = "\n".join(line for line in TINY_CONFIG.splitlines()
                     if line.split(":")[0].strip() not in {"d_model", "n_layers", "n_heads", "conv_kernel", "kv_window",
                                                          "chunk_len"})
    cfg = config_with(tmp_path, base=base, policy_path=str(tmp_path / "p.safetensors"))
    bag = write_joint_bag(tmp_path / "in", "mcap", steps=40)
    summary, _ = replay(bag, "--config", cfg, "--out", tmp_path / "out")
    assert summary["steps"] == 40 and summary["rejected"]["count"] == 0
    from flashrt_ros.tools.replay.bags import read_policy_steps, typestore
    got = np.stack([np.asarray(m.action, np.float32) for m in read_policy_steps(tmp_path / "out", typestore())])
    ref = Session(made_for.replace(capsule_budget_mb=1.0, capsule_capacity=4, max_branches=1, history_limit=16,
                                   weights_path=str(tmp_path / "p.safetensors")))
    from fixtures.make_bags import trace
    want = np.stack([ref.step(o).action for o in trace(40)])
    np.testing.assert_array_equal(got, want)
