"""`flashrt-bench persist`: what the capsule log costs and what it buys, on the NumPy backend.

- persist_step_overhead: two Sessions of the default config, one persisting into a temp dir, one not,
  stepped at 100 Hz in alternating blocks (the order swaps each round), so the noise of a shared machine
  hits both alike; step latency as StepResult reports it (the capsule and its record's queueing included).
- persist_mb_per_s: the bytes on disk after a long run at the step rate of a 100 Hz robot.
- resume_ms: a fresh Session resuming a 10-minute log (60,000 steps at 100 Hz, written as fast as the
  step allows), checked byte for byte against the Session that wrote it.
- records_lost_on_kill: a child steps at 100 Hz with persistence and prints each finished step; it is
  SIGKILLed at a random moment and the log is resumed here; lost = last step it reported - resumed step.
  The same directory is used every time and each child after the first resumes it first.
Every measurement uses the default durability (PersistSettings: fsync every 100 ms). Progress on stderr.
"""
from __future__ import annotations

import gc
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from ...runtime import PolicyConfig, Session
from ...runtime.persist.writer import MB, PersistSettings
from ..common import progress, synthetic_trace
from .measure import ratio, stats_ms

RATE_HZ = 100.0
PROGRESS_EVERY_S = 5.0


@dataclass(frozen=True)
class Plan:
    """`full` is the benchmark; `quick` is the same code at toy sizes (tests)."""
    cfg: PolicyConfig
    blocks: int  # per arm
    block_steps: int
    warmup_steps: int
    resume_steps: int
    kills: int
    kill_after_s: tuple[float, float]  # the kill lands uniformly in this window after the child is ready
    quick: bool = False

    @classmethod
    def full(cls, kills: int | None, resume_steps: int | None) -> Plan:
        return cls(PolicyConfig(), 20, 100, 200, resume_steps or 60_000, kills or 10, (0.5, 3.0))

    @classmethod
    def quick_(cls, kills: int | None, resume_steps: int | None) -> Plan:
        # a small store (fast to allocate); the model, window and record sizes are the default's
        return cls(PolicyConfig(capsule_budget_mb=64.0), 3, 25, 30, resume_steps or 1_500, kills or 2, (0.2, 0.6),
                   quick=True)


def settings_in(directory: Path) -> PersistSettings:
    return PersistSettings(Path(directory))  # the default durability: what the numbers are quoted for


def settings_doc(s: PersistSettings) -> dict:
    return {k: v for k, v in asdict(s).items() if k != "directory"}


# ---- step overhead ----------------------------------------------------------------------------
def step_overhead(plan: Plan, tmp: Path, obs: np.ndarray) -> tuple[dict, dict]:
    """p50/p99 of the step with and without persistence, interleaved blocks at 100 Hz, full window."""
    W = plan.cfg.kv_window
    progress(f"step overhead: two sessions, window filled by cold prefill of {W} observations")
    arms = {"with": Session(plan.cfg), "without": Session(plan.cfg)}
    for s in arms.values():
        s.prefill_from(obs[:W])
    st = settings_in(tmp / "overhead")
    arms["with"].enable_persistence(st)
    lat = {"with": [], "without": []}
    period = 1.0 / RATE_HZ
    i = W

    def block(arm: str, n: int, keep: bool) -> None:
        nonlocal i
        s, due = arms[arm], time.perf_counter()
        for _ in range(n):
            ms = s.step(obs[i % len(obs)]).latency_ms
            i += 1
            if keep:
                lat[arm].append(ms)
            due += period
            time.sleep(max(0.0, due - time.perf_counter()))

    for arm in arms:  # the first record (a RESYNC of the whole window) and caches warm up here
        block(arm, plan.warmup_steps, keep=False)
    t_last = time.monotonic()
    for b in range(plan.blocks):
        order = ("with", "without") if b % 2 == 0 else ("without", "with")
        for arm in order:
            block(arm, plan.block_steps, keep=True)
        if time.monotonic() - t_last > PROGRESS_EVERY_S:
            progress(f"step overhead: round {b + 1}/{plan.blocks}")
            t_last = time.monotonic()
    p = arms["with"].persistence
    p.flush()
    stats = p.stats()
    persisted_steps = plan.warmup_steps + plan.blocks * plan.block_steps
    arms["with"].disable_persistence()
    w, wo = stats_ms(lat["with"]), stats_ms(lat["without"])
    out = {"what": "step latency (StepResult.latency_ms) of two default-config NumPy sessions at a full window, "
                   "one persisting, one not, stepped at 100 Hz in alternating blocks in one run",
           "rate_hz": RATE_HZ, "kv_window": W, "steps_per_arm": len(lat["with"]), "block_steps": plan.block_steps,
           "with_persistence_ms": w, "without_persistence_ms": wo,
           "p50_ratio": ratio(w["p50"], wo["p50"]), "p99_ratio": ratio(w["p99"], wo["p99"]),
           "records_written": stats.records_written, "records_dropped": stats.records_dropped,
           "fsync_ms_max": round(stats.fsync_ms_max, 3), "persist_settings": settings_doc(st)}
    rate = {"steps": persisted_steps, "log_bytes": stats.log_bytes, "samples_ms": lat}
    arms.clear()  # one session's memory at a time from here on
    gc.collect()
    return out, rate


# ---- a 10-minute log, then resume -------------------------------------------------------------
def write_log(plan: Plan, directory: Path, obs: np.ndarray) -> tuple[Session, dict]:
    s = Session(plan.cfg)
    st = settings_in(directory)
    s.enable_persistence(st)
    n = plan.resume_steps
    progress(f"resume log: {n} steps ({n / RATE_HZ / 60:.1f} min at 100 Hz) as fast as the step goes")
    t0 = t_last = time.monotonic()
    for k in range(n):
        s.step(obs[k % len(obs)])
        if time.monotonic() - t_last > PROGRESS_EVERY_S:
            st_now = s.persistence.stats()
            progress(f"resume log: {k + 1}/{n} steps, {st_now.log_bytes / MB:.0f} MiB, "
                     f"queue {st_now.queue_records} records, {st_now.records_dropped} dropped")
            t_last = time.monotonic()
    s.persistence.flush()
    stats = s.persistence.stats()
    s.disable_persistence()
    return s, {"steps": n, "write_s": round(time.monotonic() - t0, 2), "log_bytes": stats.log_bytes,
               "segments": stats.segments, "records_written": stats.records_written,
               "records_dropped": stats.records_dropped, "resyncs_written": stats.resyncs_written}


def resume_time(plan: Plan, tmp: Path, obs: np.ndarray) -> tuple[dict, dict]:
    directory = tmp / "resume"
    writer, log = write_log(plan, directory, obs)
    want = writer.state_host().tobytes()
    del writer
    gc.collect()
    progress("resume: a fresh session reads the log and rebuilds its store")
    s = Session(plan.cfg)
    t0 = time.perf_counter()
    report = s.enable_persistence(settings_in(directory), resume=True)
    ms = (time.perf_counter() - t0) * 1e3
    s.disable_persistence()
    out = {"what": "wall time of Session.enable_persistence(resume=True) on a log of the given steps: read and "
                   "verify the newest segments (as many records as the store holds), rebuild the store, make "
                   "the newest capsule live",
           "ms": round(ms, 1), "rebuild_ms": round(report.elapsed_ms, 1), "log_steps": log["steps"],
           "log_mb": round(log["log_bytes"] / MB, 1), "segments": log["segments"],
           "records_read": report.records_read, "capsules_restored": report.capsules,
           "store_capacity": s.store.capacity, "resumed_step": report.step, "records_cut": report.records_cut,
           "state_matches_writer": s.state_host().tobytes() == want,
           "log_written": log, "persist_settings": settings_doc(settings_in(directory))}
    del s
    gc.collect()
    return out, log


def mb_per_s(steps: int, log_bytes: int, source: str) -> dict:
    seconds = steps / RATE_HZ
    return {"what": "log bytes on disk (segments + pins) / (steps / 100 Hz), MiB = 2**20 bytes; every segment "
                    "opens with a RESYNC of the whole window", "source": source, "mib_per_s": round(log_bytes / MB
                                                                                                    / seconds, 3),
            "bytes_per_step": round(log_bytes / steps), "steps": steps, "log_bytes": log_bytes}


# ---- kill -9 loop -----------------------------------------------------------------------------
CHILD = "from flashrt_ros.tools.bench.persist import kill_child; kill_child()"


def kill_child() -> None:
    """Child of the kill loop: argv = persist dir, resume 0/1, capsule_budget_mb. Steps at 100 Hz with
    persistence and prints each finished step number (flushed) until it is killed."""
    directory, resume, budget = Path(sys.argv[1]), sys.argv[2] == "1", float(sys.argv[3])
    s = Session(PolicyConfig(capsule_budget_mb=budget))
    s.enable_persistence(settings_in(directory), resume=resume)
    obs = synthetic_trace(4096, s.cfg.obs_dim, seed=3)
    print("ready", s.step_count, flush=True)
    due = time.perf_counter()
    while True:
        s.step(obs[s.step_count % len(obs)])
        print(s.step_count, flush=True)
        due += 1.0 / RATE_HZ
        time.sleep(max(0.0, due - time.perf_counter()))


def kill_loop(plan: Plan, tmp: Path) -> dict:
    directory = tmp / "kill"
    rng = random.Random(11)
    rounds = []
    progress(f"kill loop: {plan.kills} SIGKILLs of a child stepping at 100 Hz with persistence")
    for k in range(plan.kills):
        proc = subprocess.Popen([sys.executable, "-c", CHILD, str(directory), "1" if k else "0",
                                 str(plan.cfg.capsule_budget_mb)], stdout=subprocess.PIPE, text=True)
        ready = proc.stdout.readline().split()
        if not ready or ready[0] != "ready":
            proc.kill()
            proc.wait()
            raise SystemExit(f"kill loop: the child did not start (exit code {proc.returncode})")
        after = rng.uniform(*plan.kill_after_s)
        time.sleep(after)
        os.kill(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        steps = [int(line) for line in out.split() if line.isdigit()]
        last = steps[-1] if steps else int(ready[1])
        s = Session(plan.cfg)
        report = s.enable_persistence(settings_in(directory), resume=True)
        s.disable_persistence()
        lost = max(0, last - report.step)
        rounds.append({"started_at_step": int(ready[1]), "killed_after_s": round(after, 3), "last_reported": last,
                       "resumed_step": report.step, "lost": lost, "records_cut": report.records_cut})
        progress(f"kill {k + 1}/{plan.kills}: reported step {last}, resumed step {report.step}, lost {lost}")
        del s
        gc.collect()
    lost = [r["lost"] for r in rounds]
    return {"what": "a child steps the default config at 100 Hz with persistence, printing each finished step, "
                    "and is SIGKILLed at a random moment; the log is resumed in a fresh session; lost = last "
                    "reported step - resumed step (>= 0). One directory throughout: each child after the first "
                    "resumes it first",
            "kills": plan.kills, "max": max(lost), "mean": round(float(np.mean(lost)), 3),
            "records_cut_total": sum(r["records_cut"] for r in rounds), "rounds": rounds,
            "persist_settings": settings_doc(settings_in(directory))}


def run(args) -> dict:
    make = Plan.quick_ if args.quick else Plan.full
    plan = make(args.kills, args.resume_steps)
    obs = synthetic_trace(max(8192, plan.cfg.kv_window * 4), plan.cfg.obs_dim)
    with tempfile.TemporaryDirectory(prefix="flashrt-bench-persist.") as name:
        tmp = Path(name)
        overhead, measured = step_overhead(plan, tmp, obs)
        resume, log = resume_time(plan, tmp, obs)
        killed = kill_loop(plan, tmp)
    out = {"backend": "numpy", "quick": plan.quick,
           "config": "defaults (config/flashrt.yaml)" if not plan.quick else
                     f"defaults with capsule_budget_mb {plan.cfg.capsule_budget_mb:g}",
           "persist_step_overhead": overhead,
           "persist_mb_per_s": mb_per_s(log["steps"], log["log_bytes"], "the resume_ms log"),
           "resume_ms": resume,
           "records_lost_on_kill": killed}
    if getattr(args, "plot", None):  # the figure's CDFs; kept out of the JSON otherwise
        out["samples_ms"] = measured["samples_ms"]
    return out
