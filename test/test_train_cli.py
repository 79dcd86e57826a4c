"""flashrt-train (issue 43.4): pairing observations with the actions answering them, the split by bag, the fitted
normalisation, and a small training run on scripted-expert bags: its validation loss against the mean action, its
report, its resume, and the policy file it writes running in a Session in the robot's units.

Small sizes throughout (a few seconds of 100 Hz episodes, d_model 32, one layer, a few hundred steps on one
thread). The torch-free tests run in any venv; the rest need PyTorch (make test-train)."""
from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from flashrt_ros.train import data
from flashrt_ros.train.expert import ArmExpert, make_expert_bags, write_episode_bag

ROOT = Path(__file__).resolve().parents[1]
SMALL = ["--d-model", "32", "--n-layers", "1", "--n-heads", "2", "--kv-window", "64", "--chunk-len", "4",
         "--window", "32", "--batch", "16", "--threads", "1", "--lr", "3e-3"]
TOPICS = ["--obs-topic", "/observation", "--action-topic", "/joint_command"]


def _episode(name, obs, actions, valid=None):
    valid = np.ones(len(obs), bool) if valid is None else valid
    return data.Episode(name, Path(name), np.asarray(obs, np.float32), np.asarray(actions, np.float32), valid)


def _write_bag(path: Path, obs_ns, act_ns, obs_dim=2, action_type=data.F64_ARRAY):
    """JointState observations (value = index) and actions (value = 100 + index) at the given bag times."""
    from rosbags.rosbag2 import StoragePlugin, Writer
    from rosbags.typesys import Stores, get_typestore

    ts = get_typestore(Stores.ROS2_HUMBLE)
    T = ts.types
    hdr = T["std_msgs/msg/Header"](stamp=T["builtin_interfaces/msg/Time"](sec=0, nanosec=0), frame_id="")
    names = [f"j{i}" for i in range(obs_dim // 2)]
    with Writer(path, version=8, storage_plugin=StoragePlugin.MCAP) as w:
        co = w.add_connection("/js", data.JOINT_STATE, typestore=ts)
        ca = w.add_connection("/cmd", action_type, typestore=ts)
        msgs = [(ns, co, data.JOINT_STATE, T[data.JOINT_STATE](header=hdr, name=names, position=np.full(len(names), i,
                 np.float64), velocity=np.zeros(len(names)), effort=np.zeros(0))) for i, ns in enumerate(obs_ns)]
        layout = T["std_msgs/msg/MultiArrayLayout"](dim=[], data_offset=0)
        msgs += [(ns, ca, action_type, T[action_type](layout=layout, data=np.array([100.0 + i])))
                 for i, ns in enumerate(act_ns)]
        for ns, c, t, m in sorted(msgs, key=lambda x: x[0]):
            w.write(c, ns, ts.serialize_cdr(m, t))


# ---- pairing -------------------------------------------------------------------------------------------------
def test_each_observation_takes_the_first_action_at_or_after_it_within_the_delay_and_before_the_next():
    ms = 1_000_000
    obs = np.array([0, 10, 20, 30, 40, 50]) * ms
    act = np.array([0, 3, 12, 25, 39, 41, 120]) * ms
    # 0 -> the action at 0 (at counts, and 3 comes later); 10 -> 12; 20 -> 25; 30 -> none (39 is past 30 + 5 ms);
    # 40 -> 41; 50 -> none (120 is past the delay)
    got = data.pair(obs, act, max_delay_ns=5 * ms)
    assert got.tolist() == [0, 2, 3, -1, 5, -1]
    # an action after the next observation answers that one, not this one, however long the delay allowed
    assert data.pair(np.array([0, 10]) * ms, np.array([15]) * ms, max_delay_ns=50 * ms).tolist() == [-1, 0]


def test_a_bag_pairs_by_that_rule_counts_what_it_drops_and_masks_an_unanswered_observation(tmp_path):
    ms = 1_000_000
    obs_ns = [(1000 + 10 * i) * ms for i in range(8)]
    # no answer to observation 0 (dropped at the start) or 4 (kept, masked), two answers to 6 (one unused)
    act_ns = [o + 2 * ms for i, o in enumerate(obs_ns) if i not in (0, 4)] + [obs_ns[6] + 4 * ms]
    _write_bag(tmp_path / "b", obs_ns, sorted(act_ns))
    e = data.read_episode(tmp_path / "b", "/js", "/cmd", max_delay_s=0.005)
    assert len(e) == 7 and e.obs[:, 0].tolist() == list(range(1, 8))  # observation 0 dropped
    assert e.valid.tolist() == [True, True, True, False, True, True, True]
    assert e.actions[e.valid, 0].tolist() == [100, 101, 102, 103, 104, 106]  # the first answer of each
    c = e.counts
    assert (c["obs_messages"], c["paired"], c["unpaired"], c["dropped_at_ends"], c["unused_actions"]) == (8, 6, 2, 1, 1)
    assert e.obs_names == ["j0.position", "j0.velocity"]


def test_every_action_type_reads_and_a_missing_topic_names_the_topics_the_bag_has(tmp_path):
    for kind in ("joint_state", "trajectory", "array"):
        obs, act = ArmExpert().episode(0.2, seed=1)
        write_episode_bag(tmp_path / kind, obs, act, action_type=kind)
        e = data.read_episode(tmp_path / kind, "/observation", "/joint_command")
        assert e.valid.all() and np.allclose(e.actions, act, atol=1e-6), kind
        assert e.action_names == ([] if kind == "array" else [f"joint{i}" for i in range(7)])
    with pytest.raises(data.BagError, match=r"no action topic '/cmd'; the bag has: /joint_command \[std_msgs/msg/"
                                            r"Float64MultiArray\], /observation \[std_msgs/msg/Float64MultiArray\]"):
        data.read_episode(tmp_path / "array", "/observation", "/cmd")


def test_a_missing_topic_exits_2_naming_the_topics(tmp_path, capsys):
    from flashrt_ros.train import cli

    make_expert_bags(tmp_path / "bags", 2, seconds=0.2)
    rc = cli.main([str(tmp_path / "bags"), "--obs-topic", "/joint_states", "--action-topic", "/joint_command",
                   "--out", str(tmp_path / "out")])
    assert rc == 2
    err = capsys.readouterr().err
    assert "no observation topic '/joint_states'" in err and "/observation [std_msgs/msg/Float64MultiArray]" in err


# ---- the split, the normalisation ------------------------------------------------------------------------------
def test_the_split_holds_out_whole_bags_never_one_on_both_sides():
    eps = [_episode(f"bag{i}", np.full((5, 1), i), np.full((5, 1), i)) for i in range(10)]
    for val_bags, k in ((1, 1), (3, 3), (0.2, 2), (0.01, 1), (0, 1), (50, 9)):
        train, val = data.split_by_bag(eps, val_bags, seed=3)
        tn, vn = {e.name for e in train}, {e.name for e in val}
        assert len(vn) == k and not tn & vn and tn | vn == {e.name for e in eps}, val_bags
        for e in train + val:  # whole bags: every step of each
            assert len(e) == 5
    assert [e.name for e in data.split_by_bag(eps, 2, seed=3)[1]] == [e.name for e in data.split_by_bag(eps, 2, 3)[1]]
    train, val = data.split_by_bag(eps[:1], 1)  # one bag: its tail validates
    assert (len(train[0]), len(val[0])) == (4, 1) and val[0].obs[0, 0] == 0


def test_normalisation_fits_the_training_bags_only_and_maps_their_actions_onto_plus_minus_0_9():
    rng = np.random.default_rng(0)
    a = np.stack([rng.uniform(-2.0, 3.0, 200), rng.uniform(0.5, 0.7, 200), np.full(200, 4.0)], 1)
    a[0], a[1] = [-2.0, 0.5, 4.0], [3.0, 0.7, 4.0]
    obs = np.stack([rng.normal(5.0, 2.0, 200), np.full(200, 7.0)], 1)
    train = [_episode("a", obs[:100], a[:100]), _episode("b", obs[100:], a[100:])]
    val = _episode("v", obs * 100, a * 100)  # wild: must not move anything
    tr, va = data.split_by_bag([*train, val], 1, seed=0)
    norm = data.fit_normalization([e for e in [*tr, *va] if e.name != "v"])
    assert np.allclose(norm.action_offset, [0.5, 0.6, 4.0], atol=1e-6)
    assert np.allclose(norm.action_scale, [2.5 / 0.9, 0.1 / 0.9, data.MIN_ACTION_SCALE], rtol=1e-5)
    n = norm.normalize_actions(a)
    assert np.allclose(n.min(0)[:2], -0.9, atol=1e-5) and np.allclose(n.max(0)[:2], 0.9, atol=1e-5)
    assert np.allclose(n[:, 2], 0.0)  # a constant channel: its value, reachable
    assert np.allclose(norm.obs_mean, obs.mean(0), atol=1e-4)
    assert np.isclose(norm.obs_std[0], obs[:, 0].std(), rtol=1e-4) and norm.obs_std[1] == 1.0  # constant: centred


def test_chunk_targets_are_this_step_and_the_next_ones_masked_past_the_end_and_where_unpaired():
    acts = np.arange(5, dtype=np.float32)[:, None]
    valid = np.array([True, True, False, True, True])
    t, m = data.chunk_targets(acts, valid, 3)
    assert t[1, :, 0].tolist() == [1, 2, 3] and m[1].tolist() == [True, False, True]
    assert m[4].tolist() == [True, False, False] and m[3].tolist() == [True, True, False]


# ---- training (PyTorch) -----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def expert_bags(tmp_path_factory):
    d = tmp_path_factory.mktemp("expert") / "bags"
    make_expert_bags(d, 16, seconds=2.0, seed=7, expert=ArmExpert(goal_every_s=0.4, goal_range=2.5))
    return d


@pytest.fixture(scope="module")
def trained(expert_bags, tmp_path_factory):
    pytest.importorskip("torch")
    from flashrt_ros.train import cli

    out = tmp_path_factory.mktemp("run") / "out"
    rc = cli.main([str(expert_bags), *TOPICS, "--out", str(out), "--val-bags", "2", "--steps", "400",
                   "--eval-every", "50", *SMALL])
    assert rc == 0
    return out


def test_validation_loss_ends_well_below_the_mean_action_and_the_report_says_so(trained):
    r = json.loads((trained / "report.json").read_text())
    from flashrt_ros.train.report import REPORT_KEYS
    assert set(REPORT_KEYS) <= set(r)
    assert r["status"] == "finished" and r["steps"] == 400 and r["train_seconds"] > 0
    assert [h["step"] for h in r["history"]] == [50, 100, 150, 200, 250, 300, 350, 400]
    assert set(r["history"][0]) == {"step", "train_loss", "val_loss", "seconds"}
    assert r["best_val_loss"] == min(h["val_loss"] for h in r["history"])
    assert r["best_val_loss"] < 0.35 * r["baseline_val_loss"], r["history"]  # 0.20 when written (d_model 32, 400 steps)
    assert len(r["data"]["val_bags"]) == 2 and not set(r["data"]["val_bags"]) & set(r["data"]["train_bags"])
    assert r["deployed"]["rmse"] < 0.5 * r["deployed"]["mean_action_rmse"]  # 0.39 when written
    assert r["deployed"]["runtime_check"]["steps"] > 0 and r["deployed"]["runtime_check"]["max_abs_diff"] < 1e-4
    assert (trained / "report.png").stat().st_size > 10_000
    assert (trained / "checkpoint.pt").is_file()


def test_the_policy_file_runs_in_a_session_and_its_actions_are_in_the_robots_units(trained, expert_bags):
    from flashrt_ros.runtime import PolicyConfig, Session
    from flashrt_ros.runtime.model.policy_file import read_policy

    r = json.loads((trained / "report.json").read_text())
    pf = read_policy(trained / "policy.safetensors")
    norm = r["data"]["normalization"]
    assert np.allclose(pf.tensors["action_offset"], norm["action_offset"])
    assert np.allclose(pf.tensors["action_scale"], norm["action_scale"])
    assert pf.action_names == tuple(f"joint{i}" for i in range(7)) and pf.arch["d_model"] == 32
    cfg = PolicyConfig(policy_path=str(trained / "policy.safetensors"), capsule_budget_mb=16.0, max_branches=1)
    got, rec = [], []
    for bag in r["data"]["val_bags"]:  # each from the bag's start, as the node would run it
        val = data.read_episode(expert_bags / bag, "/observation", "/joint_command")
        sess = Session(cfg)
        got.append(np.stack([sess.step(o).action for o in val.obs]))
        rec.append(val.actions)
    got, rec = np.concatenate(got), np.concatenate(rec)
    assert np.abs(rec).max() > 1.2  # a target past tanh's reach was commanded ...
    far = np.abs(rec) > 1.1
    assert np.abs(got[far]).max() > 1.15  # ... and the policy reaches past it, where tanh alone never could
    assert (np.sign(got[far]) == np.sign(rec[far])).mean() > 0.95
    mean = np.concatenate([e.actions for e in data.read_episodes(
        [expert_bags / b for b in r["data"]["train_bags"]], "/observation", "/joint_command")]).mean(0)
    assert np.sqrt(((got - rec) ** 2).mean()) < 0.5 * np.sqrt(((mean - rec) ** 2).mean())


def test_a_resumed_run_continues_from_the_checkpoints_step_and_best_loss(expert_bags, tmp_path):
    torch = pytest.importorskip("torch")
    from flashrt_ros.train import cli

    out = tmp_path / "out"
    args = [str(expert_bags), *TOPICS, "--out", str(out), "--val-bags", "2", "--eval-every", "20", *SMALL]
    assert cli.main([*args, "--steps", "40"]) == 0
    first = json.loads((out / "report.json").read_text())
    assert cli.main([*args, "--steps", "60"]) == 2  # the run's directory is refused without --resume
    assert cli.main([*args, "--steps", "60", "--resume"]) == 0
    second = json.loads((out / "report.json").read_text())
    assert second["steps"] == 60 and [h["step"] for h in second["history"]] == [20, 40, 60]
    assert second["history"][:2] == first["history"]
    assert second["best_val_loss"] <= first["best_val_loss"]
    assert second["train_seconds"] > first["train_seconds"]
    ckpt = torch.load(out / "checkpoint.pt", weights_only=False)
    assert ckpt["step"] == 60 and ckpt["best_val"] == second["best_val_loss"] and ckpt["optimizer"]["state"]
    # another split (other bags held out) is not the run the checkpoint belongs to
    assert cli.main([*args[:-len(SMALL)], "--val-bags", "3", *SMALL, "--steps", "80", "--resume"]) == 2


def test_ctrl_c_checkpoints_exits_130_and_resume_finishes_the_run(expert_bags, tmp_path):
    pytest.importorskip("torch")
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "flashrt_ros.train.cli", str(expert_bags), *TOPICS, "--out", str(out),
           "--val-bags", "2", "--eval-every", "5", *SMALL]
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.Popen([*cmd, "--steps", "100000"], env=env, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not (out / "checkpoint.pt").exists() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.1)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "--resume" in err and (out / "policy.safetensors").is_file()
    r = json.loads((out / "report.json").read_text())
    assert r["status"] == "interrupted" and 5 <= r["steps"] < 100000
    done = subprocess.run([*cmd, "--steps", str(r["steps"] + 5), "--resume"], env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads((out / "report.json").read_text())["steps"] == r["steps"] + 5


def test_the_weights_kept_are_the_best_by_validation_loss_not_the_last(tmp_path):
    torch = pytest.importorskip("torch")
    from flashrt_ros.train import fit

    class Drifting(torch.nn.Module):
        """Its output moves away from every target with each training step: validation only gets worse."""

        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(1))
            self.register_buffer("calls", torch.zeros(()))

        def forward_sequence(self, obs):
            if self.training:
                self.calls += 1
            return (self.w * 0 + 0.05 * self.calls).expand(*obs.shape[:2], 2, 1)

    rng = np.random.default_rng(0)
    eps = [_episode(f"b{i}", rng.normal(size=(40, 3)), rng.uniform(-1, 1, (40, 1))) for i in range(3)]
    norm = data.fit_normalization(eps[:2])
    model = Drifting()
    opts = fit.FitOptions(steps=30, window=8, batch=2, eval_every=10)
    res = fit.fit(model, fit.prepare(eps[:2], norm, 2), fit.prepare(eps[2:], norm, 2), opts, tmp_path, {},
                  progress=fit.Progress(30, stream=io.StringIO()))
    losses = [h["val_loss"] for h in res.history]
    assert losses == sorted(losses) and res.best_step == 10 and res.best_val == losses[0]
    assert float(model.calls) == 10  # the weights (and buffers) of step 10 are what the policy file gets



def test_header_stamps_pair_by_the_messages_own_stamps_and_a_headerless_topic_is_refused(tmp_path):
    from rosbags.rosbag2 import StoragePlugin, Writer
    from rosbags.typesys import Stores, get_typestore

    ts = get_typestore(Stores.ROS2_HUMBLE)
    T = ts.types
    t0, ms = 10**18, 1_000_000
    with Writer(tmp_path / "b", version=8, storage_plugin=StoragePlugin.MCAP) as w:
        co = w.add_connection("/js", data.JOINT_STATE, typestore=ts)
        ca = w.add_connection("/cmd", data.JOINT_STATE, typestore=ts)
        for i in range(5):  # each command stamped as its observation, received 30 ms late (after the next one)
            ns = t0 + 10 * i * ms
            hdr = T["std_msgs/msg/Header"](stamp=T["builtin_interfaces/msg/Time"](sec=ns // 10**9,
                                                                               nanosec=ns % 10**9), frame_id="")
            js = lambda v, h=hdr: T[data.JOINT_STATE](header=h, name=["a"], position=np.array([v]),  # noqa: E731
                                                      velocity=np.zeros(1), effort=np.zeros(0))
            w.write(co, ns, ts.serialize_cdr(js(float(i)), data.JOINT_STATE))
            w.write(ca, ns + 30 * ms, ts.serialize_cdr(js(100.0 + i), data.JOINT_STATE))
    e = data.read_episode(tmp_path / "b", "/js", "/cmd", stamp="header")
    assert e.valid.all() and e.actions[:, 0].tolist() == [100, 101, 102, 103, 104]
    late = data.read_episode(tmp_path / "b", "/js", "/cmd")  # by receive time: the command to 0 answers 3
    assert late.obs[:, 0].tolist() == [3, 4] and late.actions[:, 0].tolist() == [100, 101]
    obs, act = ArmExpert().episode(0.1, seed=2)
    write_episode_bag(tmp_path / "f", obs, act)
    with pytest.raises(data.BagError, match="no header; use --stamp bag"):  # Float64MultiArray observations
        data.read_episode(tmp_path / "f", "/observation", "/joint_command", stamp="header")
