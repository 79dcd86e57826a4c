"""Figures of runs: the ROS mission timeline (`flashrt-demo --plot`), the runtime demo
(`flashrt-demo --runtime --plot`), a replay (`flashrt-replay BAG --plot`) and the diff of two replays
(`flashrt-replay diff A B --plot`). TraceRecorder keeps a replay's per-step data in bounded memory."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from .plots import BUDGET_MS, budget_line, pyplot, save

MAX_ACTION_DIMS = 4  # traces kept and drawn per figure: more is unreadable
DIFF_DIMS = 2  # A and B of each: twice the lines


class TraceRecorder:
    """Per-step rows (index, step, stamp, latency, action) in at most ``limit`` rows: when full, every
    other row goes and only every 2nd, 4th, ... step is kept from then on, so memory stays bounded
    however long the bag (replay streams; the figure needs no more points than pixels)."""

    def __init__(self, limit: int = 20_000):
        self.limit, self.stride, self.seen = limit, 1, 0
        self.rows: list[tuple] = []

    def add(self, step: int, stamp_ns: int, latency_ms: float, action) -> None:
        if self.seen % self.stride == 0:
            self.rows.append((self.seen, int(step), int(stamp_ns), float(latency_ms),
                              np.asarray(action, np.float32)[:MAX_ACTION_DIMS].copy()))
            if len(self.rows) >= self.limit:
                self.rows = self.rows[::2]
                self.stride *= 2
        self.seen += 1

    def to_dict(self) -> dict:
        return {"index": [r[0] for r in self.rows], "step": [r[1] for r in self.rows],
                "stamp_ns": [r[2] for r in self.rows], "latency_ms": [r[3] for r in self.rows],
                "action": [r[4].tolist() for r in self.rows], "stride": self.stride, "steps": self.seen}


def _col(rows, i) -> np.ndarray:
    return np.array([r[i] for r in rows], dtype=float) if rows else np.zeros(0)


# ---- flashrt-demo (the ROS mission) ------------------------------------------------------------------
def mission_timeline(summary: dict, path) -> Path:
    """Step latency over the mission with rollbacks and commits marked, replan round trips against the
    50 ms budget, and the observations held while a replan ran (cumulative, from /diagnostics)."""
    tl = summary.get("timeline")
    if not tl:
        raise ValueError("the mission summary has no timeline (the planner wrote none: did it start?)")
    plt = pyplot()
    fig, (a1, a2, a3) = plt.subplots(3, 1, figsize=(11, 7.5), sharex=True,
                                     gridspec_kw={"height_ratios": [3, 2, 1.2]})
    steps = tl["steps"]
    a1.scatter(_col(steps, 0), _col(steps, 1), s=2, color="tab:blue", label=f"policy step ({len(steps)})")
    rb = tl["rollbacks"]
    commits = [r for r in tl["replans"] if r[2]]
    for i, r in enumerate(rb):
        a1.axvline(r[0], color="0.6", lw=0.6, zorder=0, label="rollback 20 steps" if i == 0 else None)
    if commits:
        top = max([s[1] for s in steps], default=1.0)
        a1.scatter([c[0] for c in commits], [top * 1.05] * len(commits), marker="v", color="tab:green", s=40,
                   label=f"commit ({len(commits)})", zorder=3)
    a1.set(ylabel="step latency, ms (node)", title=f"flashrt mission ({summary.get('backend', '?')}): "
           f"{summary.get('steps', len(steps))} steps, {len(rb)} rollbacks, {len(tl['replans'])} replans")
    a1.legend(fontsize=8, loc="upper right")

    rp = tl["replans"]
    for commit, marker, label in ((False, "o", "what-if"), (True, "D", "commit")):
        sel = [r for r in rp if bool(r[2]) == commit]
        ok = [r for r in sel if r[3]]
        late = [r for r in sel if not r[3]]
        if ok:
            a2.scatter(_col(ok, 0), _col(ok, 1), marker=marker, s=18, color="tab:purple",
                       label=f"replan 4x8 round trip, {label}")
        if late:
            a2.scatter(_col(late, 0), _col(late, 1), marker=marker, s=30, color="tab:red",
                       label=f"{label}: the node missed its deadline ({len(late)})")
    budget_line(a2, BUDGET_MS)
    a2.set(ylabel="replan round trip, ms")
    a2.legend(fontsize=8, loc="upper right")

    held = tl["held"]
    a3.step(_col(held, 0), _col(held, 1), where="post", color="tab:orange")
    a3.set(xlabel="mission time, s", ylabel="held obs.\n(cumulative)")
    a3.grid(alpha=0.3)
    fig.tight_layout()
    return save(fig, path)


# ---- flashrt-demo --runtime --------------------------------------------------------------------------
def runtime_demo(summary: dict, path) -> Path:
    """The runtime demo: step latency per step, and the live action with the what-if branches forked from
    the rollback capsule and the replay from it (byte-identical, so it lies on the live line)."""
    smp = summary.get("samples")
    if not smp:
        raise ValueError("the runtime demo summary has no samples (run it with --plot)")
    plt = pyplot()
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(13, 4.2))
    lat = np.asarray(smp["step_latency_ms"])
    a1.plot(np.arange(1, lat.size + 1), lat, lw=0.8)
    a1.set(xlabel="policy step", ylabel="ms", title=f"step latency ({summary['backend']}, capsule every step)")
    start = smp["replan_start_step"]
    a1.axvline(start, color="tab:red", ls=":", label=f"rolled back to step {start}")
    a1.legend(fontsize=8)

    live = np.asarray(smp["action0"])
    a2.plot(np.arange(1, live.size + 1), live, color="black", lw=1.5, label="live action[0]")
    rep = np.asarray(smp["replayed_action0"])
    a2.plot(np.arange(start + 1, start + 1 + rep.size), rep, color="tab:cyan", ls="--", lw=1,
            label=f"replayed from the capsule (byte-exact: {summary['replay_byte_exact']})")
    for b, branch in enumerate(smp["replan_action0"]):
        a2.plot(np.arange(start + 1, start + 1 + len(branch)), branch, marker=".", lw=1,
                label=f"what-if branch {b}" if b < 4 else None)
    r = summary["replan"]
    a2.axvline(start, color="tab:red", ls=":")
    a2.set(xlabel="policy step", ylabel="action[0]",
           title=f"rollback + replan {r['branches']}x{r['horizon']}: {r['elapsed_ms']:.1f} ms "
                 f"(budget {BUDGET_MS:g} ms)")
    a2.legend(fontsize=7)
    fig.tight_layout()
    return save(fig, path)


# ---- flashrt-replay ----------------------------------------------------------------------------------
def replay_run(summary: dict, path) -> Path:
    """One replay: the recorded actions over bag time, and the step latency."""
    tr = summary.get("trace")
    if not tr or not tr["index"]:
        raise ValueError("the replay summary has no per-step trace (run flashrt-replay with --plot)")
    plt = pyplot()
    t = (np.asarray(tr["stamp_ns"], dtype=np.float64) - tr["stamp_ns"][0]) / 1e9
    act = np.asarray(tr["action"])
    fig, (a1, a2) = plt.subplots(2, 1, figsize=(11, 6), sharex=True, gridspec_kw={"height_ratios": [3, 1.5]})
    for d in range(act.shape[1]):
        a1.plot(t, act[:, d], lw=0.9, label=f"action[{d}]")
    a1.set(ylabel="action", title=f"flashrt-replay {summary.get('mode', '')}: {summary.get('steps')} steps from "
           f"{Path(str(summary.get('bag', '?'))).name}" + (f" (every {tr['stride']}th shown)" if tr["stride"] > 1
                                                           else ""))
    a1.legend(fontsize=8, loc="upper right")
    a2.plot(t, tr["latency_ms"], lw=0.6, color="tab:gray")
    a2.set(xlabel="bag time, s", ylabel="step latency, ms")
    fig.tight_layout()
    return save(fig, path)


def replay_diff(report: dict, trace_a: dict, trace_b: dict, path) -> Path:
    """Two replays step by step: their action traces (A solid, B dashed), the largest per-step difference,
    and the first divergence marked."""
    plt = pyplot()
    fig, (a1, a2) = plt.subplots(2, 1, figsize=(11, 6), sharex=True, gridspec_kw={"height_ratios": [3, 1.5]})
    xa, xb = np.asarray(trace_a["index"]), np.asarray(trace_b["index"])
    act_a, act_b = np.asarray(trace_a["action"]), np.asarray(trace_b["action"])
    for d in range(min(DIFF_DIMS, act_a.shape[1]) if act_a.ndim == 2 else 0):
        line, = a1.plot(xa, act_a[:, d], lw=1.2, label=f"A action[{d}]")
        if act_b.ndim == 2 and d < act_b.shape[1]:
            a1.plot(xb, act_b[:, d], lw=1.2, ls="--", color=line.get_color(), label=f"B action[{d}]")
    common, ia, ib = np.intersect1d(xa, xb, return_indices=True)  # the two may keep different strides
    if common.size and act_a.ndim == act_b.ndim == 2 and act_a.shape[1] == act_b.shape[1]:
        diff = np.abs(act_a[ia].astype(np.float64) - act_b[ib]).max(axis=1)
        a2.plot(common, np.where(diff > 0, diff, np.nan), color="tab:red", lw=0.9, label="max |A - B| (0 not shown)")
        if (diff > 0).any():
            a2.set_yscale("log")
    first = report.get("first_diverging_index")
    for ax in (a1, a2):
        if first is not None:
            ax.axvline(first, color="tab:red", ls=":", lw=1.5,
                       label="first divergence" if ax is a1 else None)
    if first is not None:
        a1.annotate(f"first divergence: index {first}"
                    + (f" (step {report['first_diverging_step']})" if report.get("first_diverging_step") else ""),
                    (first, 1), xycoords=("data", "axes fraction"), xytext=(4, -14), textcoords="offset points",
                    color="tab:red", fontsize=9)
    verdict = "identical" if report.get("identical") else (f"{report.get('differing_steps')} of "
                                                           f"{report.get('compared')} steps differ")
    a1.set(ylabel="action", title=f"flashrt-replay diff: {verdict} ({report.get('a_steps')} vs "
           f"{report.get('b_steps')} steps)")
    a1.legend(fontsize=7, loc="upper right", ncol=2)
    a2.set(xlabel="step index", ylabel="max |action diff|")
    if a2.get_legend_handles_labels()[0]:
        a2.legend(fontsize=8, loc="upper right")
    fig.tight_layout()
    return save(fig, path)
