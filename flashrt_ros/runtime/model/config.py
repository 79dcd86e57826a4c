"""PolicyConfig: every size and knob of the runtime, with the reason for its default.

Read from ``config/flashrt.yaml`` (``/**: ros__parameters:`` layout) so the ROS node and the
command-line tools share one source of truth.
"""
from __future__ import annotations

import dataclasses
import difflib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from .network import MIXERS

# Parameters of the ROS node that are not PolicyConfig fields: a params file may hold them. The node
# declares these (ros/params.py NODE_PARAMS, plus rclpy's use_sim_time); kept here, below the ROS layer, so
# the ROS-free tools accept the same files (test_ros_params.py checks the two lists agree).
NODE_PARAMETERS = frozenset({
    "backend", "observation_type", "observation_reliable", "joint_names", "capsule_dir", "capsule_hmac_key_file",
    "diagnostics_period_s",
    "step_deadline_ms", "replan_deadline_ms", "replan_max_deadline_ms", "autostart", "use_sim_time",
    "persist_dir", "resume", "resume_fresh_on_mismatch", "persist_fsync_ms", "persist_fsync_records",
    "persist_segment_mb", "persist_budget_mb", "persist_queue_mb", "replan_max_goal_mb", "replan_result_kept_s",
    "thread_priority", "replan_nice", "gc_freeze_period_s", "keep_freed_memory", "clean_dead_shm_segments",
    "use_shipped_dds_profile", "hold_dead_participant_ids", "thread_safe_action_client",
    "publish_trajectory", "action_joint_names", "control_period_s", "max_future_stamp_ms",
    "role", "primary", "capsule_stream", "stream_keyframe_s", "liveliness_lease_ms", "standby_takeover_delay_ms",
})


FLOAT32_MAX = 3.4028234663852886e38  # a float field becomes a float32 on the device: anything past it is inf


def _f(default, help: str, **kw):
    """kw: min (a lower bound), max (an upper bound; a float field's is FLOAT32_MAX), choices (the allowed
    values); fingerprint=False for a field that does not change what a state row means (capsule bookkeeping,
    where the weights come from): capsules stay valid across it."""
    return field(default=default, metadata={"help": help, **kw})


@dataclass(frozen=True)
class PolicyConfig:
    """Frozen: a Session is built from one validated config; change it with ``replace()``, which
    validates again."""

    obs_dim: int = _f(14, "observation length: a 7-joint arm's positions then velocities", min=1)
    action_dim: int = _f(7, "action length: one command per joint", min=1)
    d_model: int = _f(128, "residual width; small enough for a ~1 ms CPU step", min=1)
    n_layers: int = _f(4, "blocks of conv + GRU + attention + MLP", min=1)
    n_heads: int = _f(4, "attention heads; must divide d_model", min=1)
    conv_kernel: int = _f(4, "taps of the short causal conv; conv_state keeps conv_kernel-1 inputs", min=2)
    kv_window: int = _f(1024, "attention window in steps (10 s at 100 Hz); KV slots are reused modulo it", min=1)
    mixer: str = _f("gru", "recurrent mixer of each block: gru (a GRU cell) or ssm (a diagonal selective "
                           "state-space model, Mamba-style)", choices=MIXERS.keys(),
                    fingerprint=False)  # the plan and the state layout, both fingerprinted, differ per mixer
    chunk_len: int = _f(8, "actions predicted per step (action chunk / multi-token prediction)", min=1)
    chunk_blend: str = _f("newest", "temporal ensemble of the pending chunks: newest weighs the newest prediction "
                                    "most, oldest the oldest (ACT's temporal ensemble)", choices=("newest", "oldest"))
    chunk_blend_decay: float = _f(0.25, "the blend's weight per step of age: exp(-decay * age) (newest) or "
                                        "exp(+decay * age) (oldest); 0 = a plain mean; ACT uses 0.01 with oldest",
                                  min=0.0, max=80.0)
    action_noise_std: float = _f(0.0, "exploration noise std; 0 = deterministic policy", min=0.0)
    seed: int = _f(0, "seed for random weights and the counter-based noise RNG (32 bits: the RNG's key)", min=0,
                   max=2**32 - 1)
    capsule_capacity: int = _f(0, "capsule records to keep; 0 = as many as capsule_budget_mb holds (minutes at "
                                  "100 Hz: a capsule is its small state plus a shared KV log entry)", min=0,
                               fingerprint=False)
    capsule_budget_mb: float = _f(512.0, "memory for capsule records and the KV log they share; sets the rollback "
                                   "depth", min=0.0, fingerprint=False)
    capsule_every_n_steps: int = _f(1, "take a capsule after every N-th step (1 = every step)", min=1,
                                    fingerprint=False)
    max_branches: int = _f(8, "rows of the batched replan plan: branches per Replan goal", min=1,
                           fingerprint=False)
    replan_threads: int = _f(1, "cpu backend: threads a replan's batched step is split over, by rows (a row's "
                                "bytes never depend on the split); more ends a replan sooner but leaves fewer "
                                "cores to the live step and the rest of the robot: 1 on a 2-core computer, 2 "
                                "on a Jetson Orin", min=1, fingerprint=False)
    history_limit: int = _f(100_000, "observations kept for the cold-recompute baselines (~17 min at 100 Hz); "
                               "older ones are dropped", min=1, fingerprint=False)
    weights_path: str = _f("", "a policy file (or bare safetensors weights) for the configured architecture: a "
                              "file's architecture must match, f16/bf16 tensors widen exactly; empty = seeded random "
                              "weights (bf16 values)", fingerprint=False)
    policy_path: str = _f("", "a policy file whose architecture IS the config: its sizes, mixer, window, chunk and "
                              "blend replace these fields (set either this or weights_path)", fingerprint=False)

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            want = int if f.type in ("int", int) else float if f.type in ("float", float) else str
            if want is float and isinstance(v, int) and not isinstance(v, bool):
                v = float(v)
                object.__setattr__(self, f.name, v)  # frozen: the one coercion happens here
            if not isinstance(v, want) or isinstance(v, bool):
                raise ValueError(f"{f.name}: expected {want.__name__}, got {v!r}")
            lo, hi = f.metadata.get("min"), f.metadata.get("max", FLOAT32_MAX if want is float else None)
            if lo is not None and not v >= lo:  # `not >=` also rejects NaN
                raise ValueError(f"{f.name}: must be >= {lo}, got {v!r}")
            if hi is not None and not v <= hi:  # and inf
                raise ValueError(f"{f.name}: must be <= {hi:g}, got {v!r}")
            choices = f.metadata.get("choices")
            if choices is not None and v not in choices:
                raise ValueError(f"{f.name}: must be one of {', '.join(choices)}, got {v!r}")
        if self.d_model % self.n_heads:
            raise ValueError(f"n_heads: must divide d_model ({self.d_model}), got {self.n_heads}")
        if self.head_dim > 64:
            raise ValueError(f"n_heads: head_dim = d_model / n_heads must be <= 64, got {self.head_dim}")
        if self.chunk_blend_decay * (self.chunk_len - 1) > 80.0:  # exp(80) is the largest blend weight float32 holds
            raise ValueError(f"chunk_blend_decay: decay x (chunk_len - 1) must be <= 80, got "
                             f"{self.chunk_blend_decay} x {self.chunk_len - 1}")
        if self.weights_path and self.policy_path:
            raise ValueError("policy_path: set either policy_path (the file is the architecture) or weights_path "
                             "(the config is), not both")

    @property
    def blend_decay(self) -> float:
        """The ensemble kernel's signed decay: w(age) = exp(-blend_decay * age); < 0 weighs the oldest most."""
        return self.chunk_blend_decay if self.chunk_blend == "newest" else -self.chunk_blend_decay

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @classmethod
    def field_help(cls) -> dict[str, str]:
        return {f.name: f.metadata["help"] for f in dataclasses.fields(cls)}

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def replace(self, **changes: Any) -> PolicyConfig:
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_dict(cls, params: dict[str, Any], *, strict: bool = False,
                  allowed_extra: frozenset[str] | set[str] = frozenset()) -> PolicyConfig:
        """``strict``: a key that is neither a field nor in ``allowed_extra`` is an error naming it
        and the nearest field (a typo must not silently fall back to a default)."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(params) - names - set(allowed_extra))
        if strict and unknown:
            raise ValueError(unknown_key_message(unknown[0], names | set(allowed_extra)))
        return cls(**{k: v for k, v in params.items() if k in names})

    @classmethod
    def from_yaml(cls, path: str | Path, *, allowed_extra: frozenset[str] | set[str] = NODE_PARAMETERS,
                  **overrides: Any) -> PolicyConfig:
        """Read the ``ros__parameters`` of ``/**`` (or the single node key) in a ROS params file.
        Unknown keys are errors; the node's own parameters (``allowed_extra``) are skipped."""
        params = load_ros_params(path)
        params.update(overrides)
        return cls.from_dict(params, strict=True, allowed_extra=allowed_extra)


def unknown_key_message(key: str, known) -> str:
    close = difflib.get_close_matches(key, sorted(known), n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return f"{key}: unknown parameter{hint}"


def load_ros_params(path: str | Path) -> dict[str, Any]:
    doc = yaml.safe_load(Path(path).read_text()) or {}
    if not isinstance(doc, dict):
        raise ValueError(f"{path}: expected a mapping of node names")
    node = doc.get("/**") or next(iter(doc.values()), None)
    if not isinstance(node, dict) or "ros__parameters" not in node:
        raise ValueError(f"{path}: expected '/**: ros__parameters:' layout")
    return dict(node["ros__parameters"] or {})
