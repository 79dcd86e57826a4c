"""Figures of runs: the ROS mission timeline (`flashrt-demo --plot`), the runtime demo
(`flashrt-demo --runtime --plot`), a replay (`flashrt-replay BAG --plot`) and the diff of two replays
(`flashrt-replay diff A B --plot`). TraceRecorder keeps a replay's per-step data in bounded memory."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from .figures import BUDGET_MS, budget_line, pyplot, save

MAX_ACTION_DIMS = 64  # dimensions a trace keeps (a robot's joints); --joints picks which are drawn


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
    50 ms budget."""
    tl = summary.get("timeline")
    if not tl:
        raise ValueError("the mission summary has no timeline (the planner wrote none: did it start?)")
    plt = pyplot()
    fig, (a1, a2) = plt.subplots(2, 1, figsize=(11, 6.5), sharex=True, gridspec_kw={"height_ratios": [3, 2]})
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
    a2.set(xlabel="mission time, s", ylabel="replan round trip, ms")
    a2.legend(fontsize=8, loc="upper right")
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
def seconds(trace: dict, t0_ns: int) -> np.ndarray:
    """Bag time of each kept row, in seconds from t0_ns (float64: ns stamps of today lose nothing at 1 µs)."""
    return (np.asarray(trace["stamp_ns"], dtype=np.int64) - t0_ns) / 1e9


def pick_dims(n_dims: int, joints: list[int] | None) -> list[int]:
    """Every action dimension, or the --joints choice; a dimension the run does not have is an error."""
    if joints is None:
        return list(range(n_dims))
    missing = [j for j in joints if j >= n_dims]
    if missing:
        raise ValueError(f"--joints {','.join(map(str, joints))}: the actions have {n_dims} dimensions "
                         f"(0..{n_dims - 1}), not {','.join(map(str, missing))}")
    return list(joints)


def replay_run(summary: dict, path, joints: list[int] | None = None) -> Path:
    return save(draw_replay_run(summary, joints), path)


def draw_replay_run(summary: dict, joints: list[int] | None = None):
    """One replay: the recorded actions over bag time, and the step latency."""
    tr = summary.get("trace")
    if not tr or not tr["index"]:
        raise ValueError("the replay summary has no per-step trace (run flashrt-replay with --plot)")
    plt = pyplot()
    t = seconds(tr, tr["stamp_ns"][0])
    act = np.asarray(tr["action"])
    fig, (a1, a2) = plt.subplots(2, 1, figsize=(11, 6), sharex=True, gridspec_kw={"height_ratios": [3, 1.5]})
    for d in pick_dims(act.shape[1], joints):
        a1.plot(t, act[:, d], lw=0.9, label=f"action[{d}]")
    a1.set(ylabel="action (policy output units)",
           title=f"flashrt-replay {summary.get('mode', '')}: {summary.get('steps')} steps from "
           f"{Path(str(summary.get('bag', '?'))).name}" + (f" (every {tr['stride']}th shown)" if tr["stride"] > 1
                                                           else ""))
    a1.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    a2.plot(t, tr["latency_ms"], lw=0.6, color="tab:gray")
    a2.set(xlabel="bag time, s (from the first step)", ylabel="step latency, ms")
    fig.tight_layout()
    return fig


def replay_diff(report: dict, trace_a: dict, trace_b: dict, path, joints: list[int] | None = None) -> Path:
    return save(draw_replay_diff(report, trace_a, trace_b, joints), path)


def draw_replay_diff(report: dict, trace_a: dict, trace_b: dict, joints: list[int] | None = None):
    """Two replays over bag time: one panel per action dimension (A solid, B dashed; all, or --joints), the
    largest per-step difference, and the first divergence marked in each."""
    plt = pyplot()
    act_a, act_b = np.asarray(trace_a["action"]), np.asarray(trace_b["action"])
    n_dims = act_a.shape[1] if act_a.ndim == 2 else 0
    dims = pick_dims(n_dims, joints)
    stamps = [tr["stamp_ns"][0] for tr in (trace_a, trace_b) if tr["stamp_ns"]]
    t0 = min(stamps) if stamps else 0
    ta, tb = seconds(trace_a, t0), seconds(trace_b, t0)
    fig, axes = plt.subplots(len(dims) + 1, 1, figsize=(11, 2.5 + 1.35 * (len(dims) + 1)), sharex=True,
                             gridspec_kw={"height_ratios": [2] * len(dims) + [1.5]}, squeeze=False)
    axes = list(axes[:, 0])
    for ax, d in zip(axes, dims):
        ax.plot(ta, act_a[:, d], lw=1.1, color="tab:blue", label="A")
        if act_b.ndim == 2 and d < act_b.shape[1]:
            ax.plot(tb, act_b[:, d], lw=1.1, ls="--", color="tab:orange", label="B")
        ax.set_ylabel(f"action[{d}]", fontsize=9)
    xa, xb = np.asarray(trace_a["index"]), np.asarray(trace_b["index"])
    common, ia, ib = np.intersect1d(xa, xb, return_indices=True)  # the two may keep different strides
    dax = axes[-1]
    if common.size and act_a.ndim == act_b.ndim == 2 and act_a.shape[1] == act_b.shape[1]:
        diff = np.abs(act_a[ia].astype(np.float64) - act_b[ib]).max(axis=1)
        dax.plot(ta[ia], np.where(diff > 0, diff, np.nan), color="tab:red", lw=0.9,
                 label="max |A - B| over all dimensions (0 not shown)")
        if (diff > 0).any():
            dax.set_yscale("log")
    first = report.get("first_diverging_index")
    if first is not None and xa.size:
        t_first = float(np.interp(first, xa, ta))  # the trace may keep every 2nd, 4th, ... row
        for ax in axes:
            ax.axvline(t_first, color="tab:red", ls=":", lw=1.5, label="first divergence" if ax is axes[0] else None)
        step = report.get("first_diverging_step")
        axes[0].annotate(f"first divergence: {t_first:.3f} s, index {first}" + (f" (step {step})" if step else ""),
                         (t_first, 1), xycoords=("data", "axes fraction"), xytext=(4, -12),
                         textcoords="offset points", color="tab:red", fontsize=9)
    verdict = "identical" if report.get("identical") else (f"{report.get('differing_steps')} of "
                                                           f"{report.get('compared')} steps differ")
    axes[0].set_title(f"flashrt-replay diff: {verdict} ({report.get('a_steps')} vs {report.get('b_steps')} steps); "
                      "A solid, B dashed; actions in policy output units")
    axes[0].legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    dax.set(xlabel="bag time, s (from the first step)", ylabel="max |A - B|")
    if dax.get_legend_handles_labels()[0]:
        dax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    return fig
