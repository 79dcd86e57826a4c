"""A planner process for the demo: about every 0.5 s it rolls the robot back 20 steps, asks for a 4 x 8
what-if Replan, re-asks the same Replan to check the answer is byte-identical, and every few rounds
commits one branch. Prints a live line; writes a JSON summary.

    python -m flashrt_ros.tools.demo.planner --duration 20 --json out/planner.json [--namespace /robot1]
"""
from __future__ import annotations

import signal
import sys

# flashrt-demo stops the planner with SIGINT, which may land while the imports below or main()'s set-up still
# run: exit quietly then (130, no summary yet); main() puts the KeyboardInterrupt back before it waits for the node.
if __name__ == "__main__":
    signal.signal(signal.SIGINT, lambda *_: sys.exit(130))

import argparse  # noqa: E402
import json  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np
import rclpy
from diagnostic_msgs.msg import DiagnosticArray
from rclpy.qos import QoSProfile, ReliabilityPolicy

from flashrt_interfaces.msg import PolicyStep

from ...ros.client import FlashRTClient, FlashRTTimeout
from ..common import BackgroundSpin, p50_p99, synthetic_trace
from ..step_log import StepLog

ROLLBACK_STEPS = 20
BRANCHES, HORIZON = 4, 8
COMMIT_EVERY = 4
DEEP_ANCHOR_AFTER_S = 1.0  # the deep rollback check goes back to a capsule from this far into the run


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="planner", description=__doc__)
    ap.add_argument("--duration", type=float, default=15.0)
    ap.add_argument("--period", type=float, default=0.5, help="seconds between rounds")
    ap.add_argument("--namespace", default="")
    ap.add_argument("--json", help="write the summary here")
    ap.add_argument("--timeline", action="store_true",
                    help="also write every step, rollback and replan with its time (for plots)")
    args, ros_args = ap.parse_known_args(argv)
    rclpy.init(args=ros_args)
    node = rclpy.create_node("flashrt_demo_planner")
    ns = args.namespace.rstrip("/")
    client = FlashRTClient(node, ns)
    steps = StepLog()
    diag: dict = {}
    node.create_subscription(PolicyStep, f"{ns}/policy_step", steps.add,
                             QoSProfile(depth=500, reliability=ReliabilityPolicy.RELIABLE))

    timeline = Timeline()

    def on_diag(msg: DiagnosticArray) -> None:
        for st in msg.status:
            if st.name.endswith("flashrt: runtime"):
                diag.update({kv.key: kv.value for kv in st.values})

    node.create_subscription(DiagnosticArray, "/diagnostics", on_diag, 10)
    # An executor thread takes the answers as they come, as in a planner node: waiting by spin_once here cost
    # about 1 ms more per replan round trip at p50 (an executor iteration per status, feedback and step message).
    spinner = BackgroundSpin(node, "planner_executor")
    interrupted_early = False
    signal.signal(signal.SIGINT, signal.default_int_handler)  # from here a stop writes the summary so far
    try:
        client.wait_until_ready(30.0)
    except KeyboardInterrupt:  # stopped before the node was ready: an empty summary, no traceback
        interrupted_early = True
    except BaseException:  # no node to plan with: nothing to summarise, but leave nothing spinning
        spinner.stop()
        node.destroy_node()
        rclpy.try_shutdown()
        raise
    trace = synthetic_trace(4000, 14, seed=3)
    rng = np.random.default_rng(0)
    rollback_ms, replan_ms, replan_node_ms, checks = [], [], [], [0, 0]
    counts = {"misses": 0, "commits": 0, "refused": 0, "timeouts": 0}
    t0 = time.monotonic()
    timeline.t0_ns = time.time_ns()

    def one_round(commit: bool) -> None:
        r = client.rollback(steps_back=ROLLBACK_STEPS)
        if r.success:
            rollback_ms.append(r.elapsed_ms)
            timeline.rollbacks.append((time.time_ns(), r.elapsed_ms))
        start = int(rng.integers(0, len(trace) - HORIZON))
        obs = np.stack([trace[start:start + HORIZON] + 0.05 * b for b in range(BRANCHES)])
        base = r.capsule.id if r.success else None
        out = client.replan(obs, capsule_id=base, commit_branch=0 if commit else None)
        replan_ms.append(out.rtt_ms)
        timeline.replans.append((time.time_ns(), out.rtt_ms, commit, bool(out.succeeded and out.result.deadline_met)))
        counts["misses"] += int(not (out.succeeded and out.result.deadline_met))
        if not out.accepted:  # refused with a reason (busy, capsule gone, ...): report it, go on
            counts["refused"] += 1
            print(f"t={time.monotonic() - t0:5.1f}s replan refused: {out.reason}", flush=True)
            return
        replan_node_ms.append(out.result.elapsed_ms)
        if commit:
            counts["commits"] += int(out.succeeded)
        elif base and out.succeeded and out.result.deadline_met:
            again = client.replan(obs, capsule_id=base)
            if again.succeeded and again.result.deadline_met:  # compare complete answers only
                checks[0] += 1
                checks[1] += int(again.actions().tobytes() == out.actions().tobytes())
        print(f"t={time.monotonic() - t0:5.1f}s steps={len(steps):5d}  rollback {r.elapsed_ms:5.2f} ms  "
              f"replan {BRANCHES}x{HORIZON} {out.rtt_ms:6.2f} ms (node {out.result.elapsed_ms:5.2f}) "
              f"{'commit' if commit else 'what-if'}"
              f"{'' if out.result.deadline_met else ' DEADLINE MISSED'}  byte-exact {checks[1]}/{checks[0]}",
              flush=True)

    deep = DeepRollbackCheck(client)
    rounds, stopped = 0, interrupted_early
    try:
        while not stopped and time.monotonic() - t0 < args.duration:
            if deep.anchor_id == 0 and time.monotonic() - t0 >= DEEP_ANCHOR_AFTER_S and steps.last is not None:
                deep.take_anchor(steps.last)
            next_round = time.monotonic() + args.period
            rounds += 1
            try:
                one_round(commit=rounds % COMMIT_EVERY == 0)
            except FlashRTTimeout as e:  # no answer this round: say so and keep planning
                counts["timeouts"] += 1
                print(f"t={time.monotonic() - t0:5.1f}s {e}", flush=True)
            time.sleep(max(0.0, next_round - time.monotonic()))
        if not stopped and steps.last is not None:
            deep.check(steps.last)
            print(f"deep rollback: {deep.summary()}", flush=True)
        if not stopped:
            time.sleep(1.5)  # one more /diagnostics period
    except KeyboardInterrupt:  # SIGINT (flashrt-demo stopping, Ctrl-C): the summary of the rounds so far, no traceback
        stopped = True
    finally:
        spinner.stop()
        stamps_ns, latency_ms = steps.arrays()  # one set for the counts and the timeline
        summary = {
            "steps": len(latency_ms), "rejected": int(diag.get("rejected_inputs", 0)),
            "step_latency_ms": p50_p99(latency_ms),
            "rollback_ms": p50_p99(rollback_ms), "replan_ms": p50_p99(replan_ms),
            "replan_node_ms": p50_p99(replan_node_ms),
            "deadline_misses": counts["misses"], "step_deadline_misses": int(diag.get("step_deadline_misses", 0)),
            "byte_exact_checks": {"run": checks[0], "passed": checks[1]},
            "rounds": rounds, "commits": counts["commits"], "replans_refused": counts["refused"],
            "timeouts": counts["timeouts"],
            "backend": diag.get("backend", "?"), "deep_rollback": deep.summary(),
            "rollback_depth_s_diagnostics": float(diag.get("rollback_depth_s", 0.0) or 0.0),
        }
        if args.timeline:
            summary["timeline"] = timeline.summary(stamps_ns, latency_ms)
        if args.json:
            Path(args.json).write_text(json.dumps(summary, indent=2) + "\n")
        node.destroy_node()
        rclpy.try_shutdown()
    if stopped:
        return 130
    return 0 if checks[0] == checks[1] and deep.ok is not False else 1


class Timeline:
    """What `flashrt-demo --plot` draws, each event with its wall-clock time (the steps carry their
    observation's stamp, taken by the sensor on the same clock). Times out: seconds since the first round."""

    def __init__(self):
        self.t0_ns = 0
        self.rollbacks: list[tuple] = []  # (ns, node ms)
        self.replans: list[tuple] = []  # (ns, round trip ms, commit, complete within the deadline)

    def summary(self, stamps_ns: np.ndarray, latency_ms: np.ndarray) -> dict:
        def t(ns):
            return round((int(ns) - self.t0_ns) / 1e9, 4)
        return {"steps": [[t(ns), round(float(ms), 4)] for ns, ms in zip(stamps_ns, latency_ms)],
                "rollbacks": [[t(ns), round(ms, 4)] for ns, ms in self.rollbacks],
                "replans": [[t(ns), round(ms, 4), commit, met] for ns, ms, commit, met in self.replans],
                "units": "s, ms"}


class DeepRollbackCheck:
    """A capsule from the mission's first second, pinned, checked at the end as deep as the run allows:
    its export has the same state sha as at the start (its window survived every log wrap), a what-if
    replan from it gives byte-identical actions to the same replan at the start (restore is exact), and
    the robot rolls back to it. The sensor keeps stepping the live policy, so nothing here compares the
    live state itself at a moment that another step could move."""

    BRANCHES, HORIZON = 2, 8

    def __init__(self, client: FlashRTClient):
        self.client = client
        self.anchor_id, self.anchor_stamp_ns, self.anchor_sha = 0, 0, ""
        self.what_if = synthetic_trace(self.HORIZON * self.BRANCHES, 14, seed=11).reshape(
            self.BRANCHES, self.HORIZON, 14)
        self.first_actions: np.ndarray | None = None
        self.ok: bool | None = None  # None: not run
        self.depth_s = 0.0
        self.message = "not run"

    def _replan(self) -> np.ndarray | None:
        out = self.client.replan(self.what_if, capsule_id=self.anchor_id, deadline_ms=150.0)
        return out.actions() if out.succeeded else None

    def take_anchor(self, step: PolicyStep) -> None:
        pinned = self.client.pin(step.capsule_id)  # kept through every log wrap, however long the run
        r = self.client.export_capsule("deep_rollback_anchor.safetensors", capsule_id=step.capsule_id)
        if not (pinned.success and r.success):
            return
        self.anchor_id, self.anchor_sha = step.capsule_id, r.sha256
        self.anchor_stamp_ns = step.header.stamp.sec * 10**9 + step.header.stamp.nanosec
        self.first_actions = self._replan()

    def check(self, last: PolicyStep) -> None:
        if not self.anchor_id:
            self.message = "no anchor (the run was too short)"
            return
        self.depth_s = (last.header.stamp.sec * 10**9 + last.header.stamp.nanosec - self.anchor_stamp_ns) / 1e9
        exp = self.client.export_capsule("deep_rollback_anchor_again.safetensors", capsule_id=self.anchor_id)
        again = self._replan()
        r = self.client.rollback(capsule_id=self.anchor_id)
        failures = []
        if not (exp.success and exp.sha256 == self.anchor_sha):
            failures.append(f"the capsule's state changed ({exp.message or exp.sha256[:12]})")
        if self.first_actions is None or again is None:
            failures.append("a what-if replan from it did not complete")
        else:
            n = min(self.first_actions.shape[1], again.shape[1])  # a deadline may cut either one short
            if n == 0 or self.first_actions[:, :n].tobytes() != again[:, :n].tobytes():
                failures.append("a what-if replan from it gave different actions")
        if not r.success:
            failures.append(f"rollback refused: {r.message}")
        self.ok = not failures
        self.message = "byte-exact" if self.ok else "; ".join(failures)

    def summary(self) -> dict:
        return {"anchor_capsule": self.anchor_id, "depth_s": round(self.depth_s, 2), "ok": self.ok,
                "result": self.message}


if __name__ == "__main__":
    sys.exit(main())
