"""flashrt-replay: run a recorded bag through the policy and record what it did; diff two such runs.

    flashrt-replay BAG [--topic T] [--mode offline|live] [--out OUT_BAG] [--storage mcap|sqlite3]
                   [--rollback-every N --rollback-depth D] [--rate R] [--json PATH]
    flashrt-replay diff A B

Exit codes: 0 ok / identical, 1 rollback checks failed / bags differ, 2 unusable input (the message
says why).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import re
import sys
import time
from collections import Counter, deque
from pathlib import Path

import numpy as np

from ..ros.convert import message_to_obs
from ..runtime import PolicyConfig
from .bags import (
    JOINT_STATE,
    STORAGES,
    BagError,
    StepRecord,
    header_stamp_ns,
    iter_messages,
    open_observations,
    read_policy_steps,
    typestore,
    write_outputs,
)
from .common import p50_p99, progress


class Rejections:
    def __init__(self):
        self.reasons: Counter = Counter()

    def add(self, reason: str) -> None:
        self.reasons[re.sub(r"-?\d+(\.\d+)?", "N", reason)] += 1

    def summary(self) -> dict:
        return {"count": sum(self.reasons.values()), "reasons": dict(self.reasons)}


class ObservationStream:
    """The bag's observation messages converted exactly as the node converts them; rejects are counted
    with their reasons and skipped. Yields (bag stamp, observation stamp, message, observation)."""

    def __init__(self, src, ts, obs_dim: int):
        self.src, self.ts, self.obs_dim = src, ts, obs_dim
        self.obs_type = "joint_state" if src.msgtype == JOINT_STATE else "float32_array"
        self.messages = 0
        self.rejected = Rejections()

    def __iter__(self):
        for stamp, msg, err in iter_messages(self.src, self.ts):
            self.messages += 1
            if err is None:
                try:
                    obs = message_to_obs(msg, self.obs_type, self.obs_dim)
                except ValueError as e:
                    err = str(e)
            if err is not None:
                self.rejected.add(err)
                continue
            yield stamp, header_stamp_ns(msg, stamp), msg, obs


class RollbackChecks:
    """Every N steps: go back D steps, re-feed the same D observations, expect the same action bytes."""

    def __init__(self, every: int, depth: int):
        self.every, self.depth = every, depth
        self.recent: deque = deque(maxlen=max(depth, 1))
        self.run = self.passed = 0

    def due(self, steps: int) -> bool:
        return bool(self.every) and steps % self.every == 0 and steps >= self.depth

    def record(self, ok: bool) -> None:
        self.run += 1
        self.passed += int(ok)


def _load_config(path: str | None) -> PolicyConfig:
    return PolicyConfig.from_yaml(path or Path(__file__).resolve().parents[2] / "config" / "flashrt.yaml")


def run_offline(args, src, ts, cfg: PolicyConfig) -> tuple[list[StepRecord], dict]:
    from ..runtime import Session

    session = Session(cfg, args.backend)
    stream = ObservationStream(src, ts, cfg.obs_dim)
    records, checks = [], RollbackChecks(args.rollback_every, args.rollback_depth)
    t0 = time.perf_counter()
    for _, stamp_ns, _, obs in stream:
        res = session.step(obs, stamp_ns)
        records.append(StepRecord(stamp_ns, res.step, res.capsule_id, res.action, res.chunk.ravel(),
                                  cfg.chunk_len, res.latency_ms))
        checks.recent.append(obs)
        if checks.due(len(records)):
            session.rollback(steps_back=checks.depth)
            again = [session.step(o).action for o in checks.recent]
            checks.record(all(a.tobytes() == r.action.tobytes() for a, r in zip(again, records[-checks.depth:])))
        if stream.messages % 2000 == 0:
            progress(f"offline: {stream.messages}/{src.count} messages")
    return records, _summary(stream, records, checks, time.perf_counter() - t0)


def _summary(stream: ObservationStream, records, checks, wall_s) -> dict:
    actions = b"".join(r.action.astype(np.float32).tobytes() for r in records)
    return {"messages": stream.messages, "steps": len(records), "rejected": stream.rejected.summary(),
            "actions_sha256": hashlib.sha256(actions).hexdigest(),
            "step_latency_ms": p50_p99([r.latency_ms for r in records]),
            "rollback_checks": {"run": checks.run, "passed": checks.passed},
            "wall_s": round(wall_s, 3), "steps_per_s": round(len(records) / wall_s, 1) if wall_s > 0 else None}


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["diff"]:
        return diff_main(argv[1:])
    ap = argparse.ArgumentParser(prog="flashrt-replay", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("bag", help="rosbag2 directory, or one .mcap / .db3 file")
    ap.add_argument("--topic", help="observation topic (default: the only observation-typed topic)")
    ap.add_argument("--mode", choices=["offline", "live"], default="offline")
    ap.add_argument("--out", help="write /action and /policy_step to this new bag")
    ap.add_argument("--storage", choices=STORAGES, default="mcap", help="storage of --out")
    ap.add_argument("--rollback-every", type=int, default=0, metavar="N")
    ap.add_argument("--rollback-depth", type=int, default=20, metavar="D")
    ap.add_argument("--rate", type=float, default=1.0, help="live: playback speed (0 = as fast as flow control)")
    ap.add_argument("--config", help="params file (default: config/flashrt.yaml)")
    ap.add_argument("--backend", default="numpy", choices=["numpy", "cuda", "auto"])
    ap.add_argument("--json", help="write the summary here too")
    args = ap.parse_args(argv)
    if args.rollback_every < 0 or args.rollback_depth < 1 or (args.rollback_every
                                                              and args.rollback_depth > args.rollback_every):
        ap.error("--rollback-every must be >= 0 and 1 <= --rollback-depth <= --rollback-every")
    try:
        ts = typestore()
        src = open_observations(args.bag, args.topic)
        cfg = _load_config(args.config)
        progress(f"{args.mode}: {src.count} messages of {src.msgtype} on {src.topic}")
        if args.mode == "offline":
            records, summary = run_offline(args, src, ts, cfg)
        else:
            from .replay_live import run_live
            records, summary = run_live(args, src, ts, cfg)
        summary.update(mode=args.mode, topic=src.topic, bag=str(args.bag))
        if args.out:
            write_outputs(args.out, args.storage, records, ts)
            summary["out"] = str(args.out)
    except BagError as e:
        print(f"flashrt-replay: {e}", file=sys.stderr)
        return 2
    text = json.dumps(summary, indent=2)
    print(text)
    if args.json:
        Path(args.json).write_text(text + "\n")
    checks = summary["rollback_checks"]
    return 0 if checks["run"] == checks["passed"] else 1


def diff_main(argv) -> int:
    ap = argparse.ArgumentParser(prog="flashrt-replay diff", description="compare two output bags step by step; "
                                 "exit 0 only when identical")
    ap.add_argument("a")
    ap.add_argument("b")
    args = ap.parse_args(argv)
    try:
        ts = typestore()
        a, b = read_policy_steps(args.a, ts), read_policy_steps(args.b, ts)
    except BagError as e:
        print(f"flashrt-replay diff: {e}", file=sys.stderr)
        return 2
    n = min(len(a), len(b))
    first, max_abs, differing = None, 0.0, 0
    for i in range(n):
        xa, xb = np.asarray(a[i].action, np.float32), np.asarray(b[i].action, np.float32)
        if xa.tobytes() != xb.tobytes() or a[i].step != b[i].step:
            differing += 1
            if first is None:
                first = i
            if xa.shape == xb.shape:
                max_abs = max(max_abs, float(np.abs(xa.astype(np.float64) - xb).max()))
            else:
                max_abs = float("inf")
    identical = first is None and len(a) == len(b)
    report = {"identical": identical, "a_steps": len(a), "b_steps": len(b), "compared": n,
              "differing_steps": differing, "max_abs_action_diff": max_abs,
              "first_diverging_index": first, "first_diverging_step": None if first is None else int(a[first].step)}
    if first is None and len(a) != len(b):
        report["first_diverging_index"] = n
    print(json.dumps(report, indent=2))
    print("identical" if identical else
          f"DIFFERENT: first divergence at index {report['first_diverging_index']}"
          f"{'' if first is None else f' (step {a[first].step})'}, max |action diff| {max_abs:.6g}, "
          f"{differing} of {n} compared steps differ, {len(a)} vs {len(b)} steps", file=sys.stderr)
    return 0 if identical else 1


if __name__ == "__main__":
    sys.exit(main())
