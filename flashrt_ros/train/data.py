"""Demonstrations from rosbag2 bags for flashrt-train: observations paired with the actions commanded in response,
the split by bag, and the normalisation fitted on the training bags. NumPy and rosbags only (no torch).

Pairing rule: observation i (time t_i) is paired with the FIRST action message whose time t_a satisfies
t_i <= t_a <= t_i + max_delay and t_a < t_(i+1) (it came before the next observation, so one action answers one
observation). Times are the bag's receive times (`stamp="bag"`, the default: both topics on one clock) or the
messages' header stamps (`stamp="header"`: both topics need a header, e.g. JointState and JointTrajectory). An
observation with no such action stays in the sequence (the node steps on every observation) but is left out of
the loss; it is counted as unpaired, and unpaired observations before the first and after the last paired one
are dropped. Actions no observation claims are counted as unused.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..ros.io.convert import message_to_obs
from ..tools.replay import bags as bagio
from ..tools.replay.bags import BagError

JOINT_STATE, F32_ARRAY, F64_ARRAY = bagio.JOINT_STATE, bagio.F32_ARRAY, bagio.F64_ARRAY
JOINT_TRAJECTORY = "trajectory_msgs/msg/JointTrajectory"
OBSERVATION_TYPES = (JOINT_STATE, F32_ARRAY, F64_ARRAY)
ACTION_TYPES = (JOINT_STATE, JOINT_TRAJECTORY, F64_ARRAY, F32_ARRAY)
DEFAULT_MAX_DELAY_S = 0.05
ACTION_MARGIN = 0.9  # normalised actions span [-0.9, 0.9]: tanh reaches them with finite pre-activations
MIN_STD = 1e-6  # an observation channel flatter than this is constant: centred, not scaled
MIN_ACTION_SCALE = 1e-3  # robot units per normalised unit for a constant action channel


@dataclass
class Episode:
    """One bag's demonstration: obs[n, obs_dim], actions[n, action_dim] (robot units), valid[n] (paired)."""
    name: str
    path: Path
    obs: np.ndarray
    actions: np.ndarray
    valid: np.ndarray
    obs_names: list[str] = field(default_factory=list)
    action_names: list[str] = field(default_factory=list)
    counts: dict = field(default_factory=dict)
    period_s: float = 0.01  # the median interval between observations

    def __len__(self) -> int:
        return len(self.obs)


def find_bags(specs: Sequence[str | Path]) -> list[Path]:
    """Every bag named: a bag directory or storage file as it is, a directory of bags (a corpus) expanded."""
    from ..tools.replay.corpus import bag_name, is_bag, is_corpus
    from ..tools.replay.corpus import find_bags as corpus_bags

    found: list[Path] = []
    for spec in specs:
        p = Path(spec)
        if not p.exists():
            raise BagError(f"{spec}: no such bag or directory")
        if is_corpus(str(p)):
            found += corpus_bags(str(p))
        elif is_bag(p):
            found.append(p.resolve())
        else:
            raise BagError(f"{spec}: not a bag (a rosbag2 directory or a .mcap / .db3 file) nor a directory of bags")
    names: dict[str, Path] = {}
    for b in found:
        other = names.setdefault(bag_name(b), b)
        if other != b:
            raise BagError(f"two bags named {bag_name(b)!r} ({other} and {b}); the split is by bag name")
    return [names[n] for n in sorted(names)]


def _source(path: Path, topic: str, accepted: Sequence[str], what: str) -> bagio.ObservationSource:
    files, _, topics = bagio._open_storage(path, None)
    if topic not in topics:
        listed = ", ".join(f"{t} [{mt}]" for t, mt in sorted(topics.items())) or "none"
        raise BagError(f"{path}: no {what} topic {topic!r}; the bag has: {listed}")
    if topics[topic] not in accepted:
        raise BagError(f"{path}: {what} topic {topic} is {topics[topic]}, expected one of {', '.join(accepted)}")
    return bagio.ObservationSource(path, topic, topics[topic], files)


def _stamp(msg, bag_ns: int, stamp: str, where: str) -> int:
    if stamp == "bag":
        return bag_ns
    if getattr(msg, "header", None) is None:
        raise BagError(f"{where}: --stamp header, but {type(msg).__name__} has no header; use --stamp bag")
    return bagio.header_stamp_ns(msg, bag_ns)


def _by_name(names: list[str], values, order: list[str], where: str) -> np.ndarray:
    values = np.asarray(values, np.float64)
    if len(names) != len(values):
        raise ValueError(f"{where}: {len(names)} names but {len(values)} positions")
    if names == order:
        return values
    index = {n: i for i, n in enumerate(names)}
    missing = [n for n in order if n not in index]
    if missing:
        raise ValueError(f"{where}: lacks joints {missing[:4]} named by the first message")
    return values[[index[n] for n in order]]


class _ActionReader:
    """action message -> float64 [action_dim]; the joint order is the first message's."""

    def __init__(self, msgtype: str):
        self.msgtype, self.names, self.dim = msgtype, None, None

    def __call__(self, msg) -> np.ndarray:
        if self.msgtype == JOINT_STATE:
            names, values = list(msg.name), msg.position
        elif self.msgtype == JOINT_TRAJECTORY:
            if not len(msg.points):
                raise ValueError("JointTrajectory without points")
            names, values = list(msg.joint_names), msg.points[0].positions
        else:
            layout = getattr(msg, "layout", None)
            if getattr(layout, "data_offset", 0):
                raise ValueError("layout.data_offset is nonzero: actions must start at index 0 of data")
            names, values = None, msg.data
        if names is not None:
            if self.names is None:
                if len(set(names)) != len(names):
                    raise ValueError(f"names a joint twice: {names}")
                self.names = names
            a = _by_name(names, values, self.names, self.msgtype)
        else:
            a = np.asarray(values, np.float64)
        if self.dim is None:
            self.dim = a.size
        if a.shape != (self.dim,):
            raise ValueError(f"{a.size} values, the first action had {self.dim}")
        if not np.isfinite(a).all():
            raise ValueError("non-finite value")
        return a


def _read_obs(src, ts, stamp: str, counts: dict) -> tuple[np.ndarray, np.ndarray, list[str]]:
    stamps, rows, names, obs_dim = [], [], [], None
    for bag_ns, msg, _err in bagio.iter_messages(src, ts):
        if msg is None:
            counts["obs_undecodable"] += 1
            continue
        try:
            if src.msgtype == JOINT_STATE:
                if obs_dim is None:
                    names = list(msg.name)
                    obs_dim = 2 * len(names)
                o = message_to_obs(msg, "joint_state", obs_dim, names)
            else:
                if obs_dim is None:
                    obs_dim = len(msg.data)
                o = message_to_obs(msg, "float32_array", obs_dim)
        except ValueError as e:
            counts["obs_rejected"] += 1
            counts.setdefault("first_rejection", f"observation: {e}")
            continue
        stamps.append(_stamp(msg, bag_ns, stamp, f"{src.path} {src.topic}"))
        rows.append(o)
    if not rows:
        why = f"; the first refused: {counts['first_rejection']}" if "first_rejection" in counts else ""
        raise BagError(f"{src.path}: no usable observation on {src.topic} "
                       f"({counts['obs_undecodable']} undecodable, {counts['obs_rejected']} refused{why})")
    obs_names = [f"{n}.position" for n in names] + [f"{n}.velocity" for n in names] if names else []
    return np.asarray(stamps, np.int64), np.stack(rows).astype(np.float32), obs_names


def _read_actions(src, ts, stamp: str, counts: dict) -> tuple[np.ndarray, np.ndarray, list[str]]:
    reader = _ActionReader(src.msgtype)
    stamps, rows = [], []
    for bag_ns, msg, _err in bagio.iter_messages(src, ts):
        if msg is None:
            counts["actions_undecodable"] += 1
            continue
        try:
            a = reader(msg)
        except ValueError as e:
            counts["actions_rejected"] += 1
            counts.setdefault("first_rejection", f"action: {e}")
            continue
        stamps.append(_stamp(msg, bag_ns, stamp, f"{src.path} {src.topic}"))
        rows.append(a)
    if not rows:
        why = f"; the first refused: {counts['first_rejection']}" if "first_rejection" in counts else ""
        raise BagError(f"{src.path}: no usable action on {src.topic} "
                       f"({counts['actions_undecodable']} undecodable, {counts['actions_rejected']} refused{why})")
    return np.asarray(stamps, np.int64), np.stack(rows).astype(np.float32), reader.names or []


def pair(obs_ns: np.ndarray, act_ns: np.ndarray, max_delay_ns: int) -> np.ndarray:
    """For each observation, the index of its action (the pairing rule above), or -1. Both in time order."""
    obs_ns, act_ns = np.asarray(obs_ns, np.int64), np.asarray(act_ns, np.int64)
    j = np.searchsorted(act_ns, obs_ns, side="left")  # the first action at or after each observation
    nxt = np.append(obs_ns[1:], np.iinfo(np.int64).max)
    ok = j < len(act_ns)
    ta = act_ns[np.minimum(j, len(act_ns) - 1)] if len(act_ns) else np.zeros_like(obs_ns)
    ok &= (ta - obs_ns <= max_delay_ns) & (ta < nxt)
    return np.where(ok, j, -1)


def _time_order(stamps: np.ndarray, *arrays):
    order = np.argsort(stamps, kind="stable")
    return (stamps[order], *(a[order] for a in arrays))


def read_episode(path: str | Path, obs_topic: str, action_topic: str, *, stamp: str = "bag",
                 max_delay_s: float = DEFAULT_MAX_DELAY_S, ts=None) -> Episode:
    """One bag's paired demonstration; BagError names what is missing (topics, usable messages, pairs)."""
    if stamp not in ("bag", "header"):
        raise ValueError(f"stamp must be 'bag' or 'header', got {stamp!r}")
    path = Path(path)
    ts = ts or bagio.typestore()
    counts = {"obs_messages": 0, "obs_undecodable": 0, "obs_rejected": 0, "actions_undecodable": 0,
              "actions_rejected": 0}
    o_src = _source(path, obs_topic, OBSERVATION_TYPES, "observation")
    a_src = _source(path, action_topic, ACTION_TYPES, "action")
    o_ns, obs, obs_names = _read_obs(o_src, ts, stamp, counts)
    a_ns, act, action_names = _read_actions(a_src, ts, stamp, counts)
    o_ns, obs = _time_order(o_ns, obs)
    a_ns, act = _time_order(a_ns, act)
    idx = pair(o_ns, a_ns, int(round(max_delay_s * 1e9)))
    paired = np.flatnonzero(idx >= 0)
    counts.update(obs_messages=int(len(o_ns)), action_messages=int(len(a_ns)), paired=int(paired.size))
    if not paired.size:
        lag = (a_ns[0] - o_ns[0]) / 1e6
        raise BagError(f"{path}: no observation on {obs_topic} has an action on {action_topic} within "
                       f"{max_delay_s * 1e3:g} ms after it and before the next observation (the first action comes "
                       f"{lag:+.1f} ms after the first observation; --stamp {stamp}, see --max-delay)")
    lo, hi = paired[0], paired[-1] + 1  # unpaired observations at either end are dropped
    idx = idx[lo:hi]
    valid = idx >= 0
    actions = np.zeros((hi - lo, act.shape[1]), np.float32)
    actions[valid] = act[idx[valid]]
    counts.update(unpaired=int(len(o_ns) - paired.size), dropped_at_ends=int(len(o_ns) - (hi - lo)),
                  unused_actions=int(len(a_ns) - paired.size))
    from ..tools.replay.corpus import bag_name
    period = float(np.median(np.diff(o_ns[lo:hi]))) / 1e9 if hi - lo > 1 else 0.01
    return Episode(bag_name(path), path, obs[lo:hi], actions, valid, obs_names, action_names, counts, period)


def read_episodes(paths: Sequence[Path], obs_topic: str, action_topic: str, **kw) -> list[Episode]:
    """Every bag's episode; they must agree on obs_dim, action_dim and the channel names."""
    ts = kw.pop("ts", None) or bagio.typestore()
    eps = [read_episode(p, obs_topic, action_topic, ts=ts, **kw) for p in paths]
    first = eps[0]
    for e in eps[1:]:
        for what in ("obs", "actions"):
            if getattr(e, what).shape[1] != getattr(first, what).shape[1]:
                raise BagError(f"{e.path}: {what} have {getattr(e, what).shape[1]} values, {first.path} has "
                               f"{getattr(first, what).shape[1]}")
        for what in ("obs_names", "action_names"):
            if getattr(e, what) != getattr(first, what):
                raise BagError(f"{e.path}: {what} {getattr(e, what)[:4]}... differ from {first.path}'s "
                               f"{getattr(first, what)[:4]}...")
    return eps


# ---- the split, by bag --------------------------------------------------------------------------------------
def split_by_bag(episodes: Sequence[Episode], val_bags: float, seed: int = 0,
                 single_bag_fraction: float = 0.2) -> tuple[list[Episode], list[Episode]]:
    """(train, validation). val_bags >= 1 is a count of bags, 0 < val_bags < 1 a fraction of them (rounded, at
    least one); with 2+ bags at least one is held out and at least one trains. Which bags: a permutation
    seeded by `seed`, so a resumed run gets the same split. One bag only: its last single_bag_fraction of
    steps validates (the only case where one bag feeds both sides)."""
    n = len(episodes)
    if n == 0:
        raise ValueError("no episodes")
    if not val_bags >= 0:
        raise ValueError(f"--val-bags must be >= 0, got {val_bags}")
    if n == 1:
        e = episodes[0]
        cut = max(1, min(len(e) - 1, int(round(len(e) * (1 - single_bag_fraction)))))
        part = lambda s, tag: Episode(f"{e.name}{tag}", e.path, e.obs[s], e.actions[s], e.valid[s],  # noqa: E731
                                      e.obs_names, e.action_names, e.counts, e.period_s)
        return [part(slice(0, cut), "[train]")], [part(slice(cut, None), "[val]")]
    k = int(val_bags) if val_bags >= 1 else int(round(val_bags * n))
    k = min(max(k, 1), n - 1)
    order = np.random.default_rng(seed).permutation(n)
    held = set(order[:k].tolist())
    train = [e for i, e in enumerate(episodes) if i not in held]
    val = [e for i, e in enumerate(episodes) if i in held]
    return train, val


# ---- normalisation ------------------------------------------------------------------------------------------
@dataclass
class Normalization:
    obs_mean: np.ndarray
    obs_std: np.ndarray
    action_scale: np.ndarray
    action_offset: np.ndarray

    def normalize_actions(self, a: np.ndarray) -> np.ndarray:
        return ((a - self.action_offset) / self.action_scale).astype(np.float32)

    def to_dict(self) -> dict:
        return {k: getattr(self, k).tolist() for k in ("obs_mean", "obs_std", "action_scale", "action_offset")}


def fit_normalization(train: Sequence[Episode]) -> Normalization:
    """From the training bags only: obs mean/std over every observation; action offset = mid-range, scale =
    half-range / ACTION_MARGIN over the paired actions, so the recorded range maps onto [-0.9, 0.9]."""
    obs = np.concatenate([e.obs for e in train]).astype(np.float64)
    act = np.concatenate([e.actions[e.valid] for e in train]).astype(np.float64)
    if not len(act):
        raise ValueError("no paired action in the training bags")
    mean, std = obs.mean(0), obs.std(0)
    std = np.where(std > MIN_STD * np.maximum(1.0, np.abs(mean)), std, 1.0)
    lo, hi = act.min(0), act.max(0)
    offset = (lo + hi) / 2
    scale = np.maximum((hi - lo) / 2 / ACTION_MARGIN, MIN_ACTION_SCALE)
    f = np.float32
    return Normalization(mean.astype(f), std.astype(f), scale.astype(f), offset.astype(f))


# ---- targets ------------------------------------------------------------------------------------------------
def chunk_targets(actions_n: np.ndarray, valid: np.ndarray, chunk_len: int) -> tuple[np.ndarray, np.ndarray]:
    """(targets [n, K, A], mask [n, K]): step t's chunk predicts the actions of steps t .. t+K-1 (entry 0 is
    this step's own action, as the temporal ensemble reads it); entries past the end or unpaired are masked."""
    n, a = actions_n.shape
    pad = np.concatenate([actions_n, np.zeros((chunk_len, a), actions_n.dtype)])
    vpad = np.concatenate([valid, np.zeros(chunk_len, bool)])
    idx = np.arange(n)[:, None] + np.arange(chunk_len)[None, :]
    return pad[idx], vpad[idx]
