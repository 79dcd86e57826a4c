"""The arm mission's planner process: it watches the arm through the policy node's steps and the sim's
observations, and on each late correction (observation_corrected, sim/fault_feed.py) rolls the policy back to the
capsule before the fault and re-steps the corrected readings as ONE committed Replan (capsule_id of the reading
just before the fault, the corrected block, commit_branch 0), timing the round trip. Then it repeats the same
replan as a what-if from the same capsule: the actions must be byte-identical (restore and replay are exact).
Writes a JSON summary: episodes and successes, faults, corrections, replan round trips, byte-exact checks and,
with --timeline, the hand's trajectory for flashrt-demo --plot.

    python -m flashrt_ros.sim.mission_planner --namespace /arm --duration 30 --episode-s 10 --json out.json
"""
from __future__ import annotations

import signal
import sys

if __name__ == "__main__":  # flashrt-demo stops the planner with SIGINT, perhaps while it still imports
    signal.signal(signal.SIGINT, lambda *_: sys.exit(130))

import argparse  # noqa: E402
import collections  # noqa: E402
import json  # noqa: E402
import queue  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import rclpy  # noqa: E402
from diagnostic_msgs.msg import DiagnosticArray  # noqa: E402
from rclpy.qos import QoSProfile, ReliabilityPolicy  # noqa: E402
from rosgraph_msgs.msg import Clock  # noqa: E402
from std_msgs.msg import Float32MultiArray, Float64MultiArray  # noqa: E402

from flashrt_interfaces.msg import PolicyStep  # noqa: E402

from ..ros.client import FlashRTClient, FlashRTTimeout  # noqa: E402
from ..ros.io.convert import stamp_to_ns  # noqa: E402
from ..ros.io.step_link import policy_step_qos  # noqa: E402
from ..ros.platform.gc_freeze import GcFreezer  # noqa: E402
from ..tools.common import BackgroundSpin, p50_p99  # noqa: E402
from .correction import REPLAN_BUDGET_MS  # noqa: E402
from .fault_feed import CORRECTION_TOPIC, parse_correction  # noqa: E402
from .faults import HAND  # noqa: E402
from .ros_eval import GOAL_XY, OBJECT_XY  # noqa: E402
from .world import CONTROL_HZ, WorldConfig  # noqa: E402

STEP_NS = 1_000_000_000 // CONTROL_HZ
# the node refuses a goal over its replan_max_deadline_ms (200 by default); a correction cut short would commit
# a block missing its newest readings, so it gets the longest: a round trip past 50 ms is counted as a miss
CORRECTION_DEADLINE_MS = 200.0
GC_FREEZE_PERIOD_S = 5.0  # as the policy node's default gc_freeze_period_s


def pct(samples) -> dict:
    """p50 / p99 / max of the samples (None each when there are none)."""
    return {**p50_p99(samples), "max": round(float(max(samples)), 4) if len(samples) else None}


class ArmWatch:
    """What the planner hears, filled by the executor thread: sim time, the policy's capsules by stamp, the
    readings by episode, and the corrections to handle."""

    def __init__(self, episode_ns: int):
        self.lock = threading.Lock()
        self.episode_ns = episode_ns
        self.clock_ns = 0
        self.first_clock_ns: int | None = None
        self.capsule_at: dict[int, int] = {}  # the reading's sim stamp -> the capsule of the policy step on it
        self.step_latency_ms: list[float] = []
        self.steps_seen = 0
        self.recent_offsets: collections.deque = collections.deque(maxlen=200)  # node stamp minus the count
        self.all_offsets: list[int] = []
        self.readings_seen = 0
        self.frozen = False  # the mission is over: later readings are no episode's
        self.readings: dict[int, list] = {}  # episode -> [(sim ns, hand x, y, object-goal distance)]
        self.goal: dict[int, list[float]] = {}
        self.object_start: dict[int, list[float]] = {}
        self.corrections: queue.Queue = queue.Queue()
        self.diag: dict = {}

    def on_clock(self, msg) -> None:
        with self.lock:
            self.clock_ns = stamp_to_ns(msg.clock)
            if self.first_clock_ns is None:
                self.first_clock_ns = self.clock_ns

    def on_step(self, msg) -> None:
        """The node stamps a float array with its /clock when it takes the reading, which under load is a period
        or more late (readings queued while /clock went on), and it may miss the sim's first readings (discovery).
        Within the run the policy steps follow the readings one by one (reliable QoS), so the k-th step is the
        first step's reading plus k x 10 ms: the capsules are kept by that count, and the offset of the count to
        the readings' stamps is the most common difference between the node's stamps and the count (most stamps
        are right)."""
        ns = stamp_to_ns(msg.header.stamp)
        with self.lock:
            counted_ns = self.steps_seen * STEP_NS
            self.steps_seen += 1
            self.recent_offsets.append(ns - counted_ns)
            self.all_offsets.append(ns - counted_ns)
            self.capsule_at[counted_ns] = int(msg.capsule_id)
            self.step_latency_ms.append(float(msg.step_latency_ms))

    def on_observation(self, msg) -> None:
        obs = np.asarray(msg.data, np.float32)
        with self.lock:
            if self.frozen:
                return
            reading_ns = self.readings_seen * STEP_NS  # every reading arrives, in order, from sim time 0
            self.readings_seen += 1
            episode = reading_ns // self.episode_ns
            distance = float(np.linalg.norm(obs[OBJECT_XY] - obs[GOAL_XY]))
            self.readings.setdefault(episode, []).append((reading_ns, float(obs[HAND][0]), float(obs[HAND][1]),
                                                          distance))
            self.goal.setdefault(episode, obs[GOAL_XY].tolist())
            self.object_start.setdefault(episode, obs[OBJECT_XY].tolist())

    def on_correction(self, msg) -> None:
        self.corrections.put((time.perf_counter(), msg))

    def on_diag(self, msg) -> None:
        for st in msg.status:
            if st.name.endswith("flashrt: runtime"):
                self.diag.update({kv.key: kv.value for kv in st.values})

    def capsule_of_reading(self, reading_ns: int) -> tuple[int | None, int]:
        """(the capsule of the policy step on the reading of this sim stamp or None, the count's offset in ns)."""
        with self.lock:
            if not self.recent_offsets:
                return None, 0
            offset = collections.Counter(self.recent_offsets).most_common(1)[0][0]
            return self.capsule_at.get(reading_ns - offset), offset

    def stamp_lateness_ms(self) -> dict[str, int]:
        """How late the node stamped the readings, ms -> policy steps (against the run's most common offset)."""
        with self.lock:
            if not self.all_offsets:
                return {}
            mode = collections.Counter(self.all_offsets).most_common(1)[0][0]
            late = collections.Counter((ns - mode) // 1_000_000 for ns in self.all_offsets)
        return {str(k): v for k, v in sorted(late.items())}

    def sim_seconds(self) -> float:
        with self.lock:
            return 0.0 if self.first_clock_ns is None else (self.clock_ns - self.first_clock_ns) / 1e9


class Corrector:
    """One committed replan per correction, then the same replan as a what-if: byte-exact or not."""

    def __init__(self, client: FlashRTClient, watch: ArmWatch, correct: bool):
        self.client, self.watch, self.correct = client, watch, correct
        self.events: list[dict] = []

    def handle(self, arrived: float, msg: Float64MultiArray) -> None:
        c = parse_correction(msg)
        before_ns = int(c.stamps_ns[0]) - STEP_NS  # the reading just before the fault's first bad one
        capsule, offset_ns = self.watch.capsule_of_reading(before_ns)
        event = {"kind": c.kind, "bad_readings": c.bad_readings, "rows": len(c.stamps_ns),
                 "start_ns": int(c.stamps_ns[0]), "end_ns": int(c.stamps_ns[c.bad_readings - 1]),
                 "arrived_ns": int(c.stamps_ns[-1]) + STEP_NS, "capsule": capsule, "committed": False,
                 "count_offset_ms": offset_ns / 1e6,
                 "rtt_ms": None, "node_ms": None, "to_commit_ms": None, "byte_exact": None,
                 "hand_corrected": c.observations[:c.bad_readings, HAND][:, :2].round(4).tolist()}
        self.events.append(event)
        if not self.correct or capsule is None:
            return
        block = c.observations[None]
        out = self.client.replan(block, capsule_id=capsule, commit_branch=0, deadline_ms=CORRECTION_DEADLINE_MS)
        event["rtt_ms"] = round(out.rtt_ms, 3)
        event["to_commit_ms"] = round((time.perf_counter() - arrived) * 1e3, 3)
        if not out.succeeded:
            event["refused"] = out.reason if not out.accepted else out.result.message
            return
        event["node_ms"] = round(out.result.elapsed_ms, 3)
        event["committed"] = bool(out.result.deadline_met and out.result.steps_done == block.shape[1])
        again = self.client.replan(block, capsule_id=capsule, deadline_ms=CORRECTION_DEADLINE_MS)
        if again.succeeded and again.result.steps_done == out.result.steps_done:
            event["byte_exact"] = again.actions().tobytes() == out.actions().tobytes()

    def summary(self) -> dict:
        ev = self.events
        rtt = [e["rtt_ms"] for e in ev if e["rtt_ms"] is not None]
        checked = [e["byte_exact"] for e in ev if e["byte_exact"] is not None]
        kinds: dict[str, int] = {}
        for e in ev:
            kinds[e["kind"]] = kinds.get(e["kind"], 0) + 1
        return {"corrections": len(ev), "faults_by_kind": dict(sorted(kinds.items())),
                "correction_replans": len(rtt), "replans_committed": sum(e["committed"] for e in ev),
                "no_capsule_before_fault": sum(e["capsule"] is None for e in ev),
                "replan_ms": pct(rtt), "replan_node_ms": pct([e["node_ms"] for e in ev if e["node_ms"] is not None]),
                "correction_to_commit_ms": pct([e["to_commit_ms"] for e in ev if e["to_commit_ms"] is not None]),
                "replan_budget_ms": REPLAN_BUDGET_MS,
                # past the 50 ms budget, or not committed whole within the node's deadline
                "deadline_misses": sum(e["rtt_ms"] is not None
                                       and (e["rtt_ms"] > REPLAN_BUDGET_MS or not e["committed"]) for e in ev),
                "byte_exact_checks": {"run": len(checked), "passed": int(sum(checked))}}


def episodes_run(watch: ArmWatch, duration_s: float) -> list[int]:
    """The episodes that started within the mission's duration (the readings after it belong to none)."""
    return [e for e in sorted(watch.readings) if e * watch.episode_ns < duration_s * 1e9]


def episodes_summary(watch: ArmWatch, episodes: list[int], radius: float) -> list[dict]:
    out = []
    for episode in episodes:
        rows = watch.readings[episode]
        hit = next((ns for ns, _, _, d in rows if d <= radius), None)
        out.append({"episode": int(episode), "readings": len(rows), "success": hit is not None,
                    "success_s": None if hit is None else round((hit - episode * watch.episode_ns) / 1e9, 2),
                    "final_distance_m": round(rows[-1][3], 4)})
    return out


def trajectory(watch: ArmWatch, episodes: list[int], events: list[dict]) -> list[dict]:
    """Per episode: the hand as read (x, y), the goal, the object's start, and the faults with their fate."""
    out = []
    for episode in episodes:
        lo, hi = episode * watch.episode_ns, (episode + 1) * watch.episode_ns
        out.append({"episode": int(episode), "goal": [round(v, 4) for v in watch.goal[episode]],
                    "object_start": [round(v, 4) for v in watch.object_start[episode]],
                    "hand": [[round((ns - lo) / 1e9, 3), round(x, 4), round(y, 4)]
                             for ns, x, y, _ in watch.readings[episode]],
                    "faults": [{**e, "start_s": round((e["start_ns"] - lo) / 1e9, 3),
                                "end_s": round((e["end_ns"] - lo) / 1e9, 3),
                                "arrived_s": round((e["arrived_ns"] - lo) / 1e9, 3)}
                               for e in events if lo <= e["start_ns"] < hi]})
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="mission_planner", description=__doc__)
    ap.add_argument("--namespace", default="/arm")
    ap.add_argument("--duration", type=float, default=30.0, help="sim seconds, from the sim's first /clock")
    ap.add_argument("--episode-s", type=float, default=10.0, help="the sim's episode_s")
    ap.add_argument("--no-correction", action="store_true", help="count the corrections, replan none (ablation)")
    ap.add_argument("--wall-limit", type=float, default=0.0, help="give up after this many wall seconds (0: 3x "
                    "the duration + 60)")
    ap.add_argument("--json", help="write the summary here")
    ap.add_argument("--timeline", action="store_true", help="also write the hand's trajectory (for --plot)")
    args, ros_args = ap.parse_known_args(argv)
    rclpy.init(args=ros_args)
    node = rclpy.create_node("flashrt_arm_planner")
    ns = args.namespace.rstrip("/")
    # the Replan client on a node and executor thread of its own, so the watcher's 300 callbacks a second
    # (/clock, observation, policy_step) are never queued ahead of the replan's answers
    client_node = rclpy.create_node("flashrt_arm_planner_client")
    client = FlashRTClient(client_node, ns)
    watch = ArmWatch(int(round(args.episode_s * 1e9)))
    reliable = QoSProfile(depth=100, reliability=ReliabilityPolicy.RELIABLE)
    node.create_subscription(Clock, "/clock", watch.on_clock, reliable)
    node.create_subscription(PolicyStep, f"{ns}/policy_step", watch.on_step, policy_step_qos(500))
    node.create_subscription(Float32MultiArray, f"{ns}/observation", watch.on_observation, reliable)
    node.create_subscription(DiagnosticArray, "/diagnostics", watch.on_diag, 10)
    # the readings of a whole run stay in memory: a full collection walking them stopped the planner (and the
    # replan answer it waited for) 32 ms in a 100 s run; frozen, the collector never walks them again
    GcFreezer(node, GC_FREEZE_PERIOD_S)
    spinners = [BackgroundSpin(node, "planner_executor"), BackgroundSpin(client_node, "planner_client_executor")]
    corrector = Corrector(client, watch, correct=not args.no_correction)
    stopped, timeouts = False, 0
    signal.signal(signal.SIGINT, signal.default_int_handler)  # from here a stop writes the summary so far
    t0 = time.monotonic()
    wall_limit = args.wall_limit or 3 * args.duration + 60
    try:
        client.wait_until_ready(30.0)
        # subscribed last: flashrt-demo starts the sim once this subscription shows, with the planner ready
        node.create_subscription(Float64MultiArray, f"{ns}/{CORRECTION_TOPIC}", watch.on_correction, reliable)
        while watch.sim_seconds() < args.duration and time.monotonic() - t0 < wall_limit:
            try:
                arrived, msg = watch.corrections.get(timeout=0.05)
            except queue.Empty:
                continue
            try:
                corrector.handle(arrived, msg)
            except FlashRTTimeout as e:
                timeouts += 1
                print(f"correction: {e}", flush=True)
                continue
            e = corrector.events[-1]
            print(f"t={watch.sim_seconds():5.2f}s {e['kind']:12s} {e['bad_readings']:2d} bad readings, "
                  f"{e['rows']:2d} re-stepped: replan {e['rtt_ms']} ms, committed {e['committed']}, "
                  f"byte-exact {e['byte_exact']}", flush=True)
        with watch.lock:
            watch.frozen = True
        deadline = time.monotonic() + 1.0  # the policy steps on the last readings may still be on their way
        while watch.steps_seen < watch.readings_seen and time.monotonic() < deadline:
            time.sleep(0.02)
    except KeyboardInterrupt:
        stopped = True
    finally:
        for spinner in spinners:
            spinner.stop()
        run = episodes_run(watch, args.duration)
        episodes = episodes_summary(watch, run, WorldConfig().success_radius)
        summary = {"mission": "arm", "namespace": ns, "correction": not args.no_correction,
                   "sim_seconds": round(watch.sim_seconds(), 2), "episode_s": args.episode_s,
                   "episodes": len(episodes), "successes": sum(e["success"] for e in episodes),
                   "per_episode": episodes, **corrector.summary(), "timeouts": timeouts,
                   "steps": len(watch.step_latency_ms), "step_latency_ms": pct(watch.step_latency_ms),
                   "readings": watch.readings_seen,
                   "readings_not_stepped": max(0, watch.readings_seen - watch.steps_seen),
                   "step_stamp_late_ms": watch.stamp_lateness_ms(),
                   "backend": watch.diag.get("backend", "?"),
                   "rejected": int(watch.diag.get("rejected_inputs", 0) or 0),
                   "reached_duration": watch.sim_seconds() >= args.duration}
        if args.timeline:
            summary["trajectory"] = trajectory(watch, run, corrector.events)
        if args.json:
            Path(args.json).write_text(json.dumps(summary, indent=2) + "\n")
        client_node.destroy_node()
        node.destroy_node()
        rclpy.try_shutdown()
    return 130 if stopped else 0


if __name__ == "__main__":
    sys.exit(main())
