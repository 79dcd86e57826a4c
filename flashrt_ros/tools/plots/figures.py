"""Pictures of what the tools measured: one function per figure, each taking the result dict a tool
already produces (JSON-ready) and writing a PNG. ROS-free; matplotlib is optional and imported only
here, on first use, with the Agg backend (no display needed).

The figures of the benchmarks live here; the mission, runtime-demo and replay figures in plots/runs.py,
the capsule lineage in plots/lineage.py.
"""
from __future__ import annotations

from pathlib import Path

INSTALL_HINT = "--plot needs matplotlib: pip install matplotlib (in this repo's venv: .venv/bin/pip install matplotlib)"
DPI = 100
BUDGET_MS = 50.0  # the replan deadline the demos and the node use by default
PAPER_SPEEDUPS = {2048: 3.9, 16384: 27.0}  # rollback + re-plan over cold recompute, as the paper reports (GPU)


class PlotUnavailable(RuntimeError):
    """matplotlib is not installed: the message is the one-line install hint."""


def pyplot():
    """matplotlib.pyplot on the Agg backend, or PlotUnavailable with the install hint."""
    try:
        import matplotlib
    except ImportError:
        raise PlotUnavailable(INSTALL_HINT) from None
    matplotlib.use("Agg", force=True)  # files only: never a window, never a display
    import matplotlib.pyplot as plt
    return plt


def require_matplotlib() -> None:
    """Check up front (argument parsing), so a missing matplotlib never costs a long run first."""
    pyplot()


def save(fig, path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=DPI, bbox_inches="tight")
    pyplot().close(fig)
    return path


def budget_line(ax, ms: float = BUDGET_MS, axis: str = "y") -> None:
    line = ax.axhline if axis == "y" else ax.axvline
    line(ms, color="tab:red", ls="--", lw=1, label=f"{ms:g} ms budget")


def history_ticks(ax, h) -> None:
    """Log x with one labelled tick per measured history; log y labelled at 1, 2, 5 x 10^k as plain numbers."""
    from matplotlib.ticker import FormatStrFormatter, LogLocator, NullFormatter

    ax.minorticks_off()
    ax.set_xticks(h, [str(x) for x in h])
    if h:
        ax.set_xlim(min(h) / 1.3, max(h) * 1.3)
    ax.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(FormatStrFormatter("%g"))
    ax.yaxis.set_minor_formatter(NullFormatter())


# ---- flashrt-bench runtime ---------------------------------------------------------------------------
def bench_runtime(result: dict, path) -> Path:
    return save(draw_bench_runtime(result), path)


def draw_bench_runtime(result: dict):
    """Three panels from `flashrt-bench runtime`: capsule copies against a memcpy over the history;
    rollback + re-plan against cold prefill (log axes, the measured speedups written on); replan time
    per case (branches x horizon @ window), shared window and copy per branch, with the 50 ms line."""
    plt = pyplot()
    hist = result.get("histories") or []
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    backend = result.get("backend") or "?"
    fig.suptitle(f"flashrt-bench runtime ({backend}{', quick sizes' if result.get('quick') else ''})")

    ax = axes[0]
    h = [p["history"] for p in hist]
    for key, label, marker in (("snapshot_ms", "snapshot", "o"), ("restore_ms", "restore", "s"),
                               ("memcpy_ms", "memcpy of the same bytes", "^")):
        ax.plot(h, [p[key] * 1e3 for p in hist], marker=marker, label=label)
    ax.set(xscale="log", yscale="log", xlabel="history = kv_window (steps)", ylabel="µs (median)",
           title="capsule snapshot / restore vs memcpy")
    history_ticks(ax, h)
    ax.legend(fontsize=8)

    ax = axes[1]
    cold = [p["cold_prefill_ms"] for p in hist]
    warm = [p["rollback_replan_ms"] for p in hist]
    ax.plot(h, cold, marker="o", label="cold prefill (tuned, same backend)")
    ax.plot(h, warm, marker="s", label="rollback + 8-step re-plan")
    replay = [(p["history"], p["cold_replay_ms"]) for p in hist if p.get("cold_replay_ms")]
    if replay:
        ax.plot(*zip(*replay), marker="x", ls=":", label="cold replay (step by step)")
    for p in hist:  # below the rollback points: the lowest line, nothing under it to collide with
        x = p["speedup_vs_prefill"]
        ax.annotate(f"{x:.{0 if x >= 10 else 1}f}x", (p["history"], p["rollback_replan_ms"]),
                    textcoords="offset points", xytext=(0, -8), ha="center", va="top", fontsize=9, weight="bold")
    # the paper's points (GPU): where rollback + re-plan would sit at its speedups over this run's cold prefill;
    # their values go in the legend, not beside the stars (they sit close to the measured labels)
    paper = [(p["history"], p["cold_prefill_ms"] / PAPER_SPEEDUPS[p["history"]], PAPER_SPEEDUPS[p["history"]])
             for p in hist if p["history"] in PAPER_SPEEDUPS]
    if paper:
        ax.scatter([q[0] for q in paper], [q[1] for q in paper], marker="*", s=110, color="tab:purple", zorder=3,
                   label="the paper's GPU speedup on this cold prefill: "
                   + ", ".join(f"{k:g}x at {hx}" for hx, _, k in paper))
    ax.set(xscale="log", yscale="log", xlabel="history = kv_window (steps)", ylabel="ms (median)",
           title="rollback + re-plan vs cold recompute\n(labels: speedup vs tuned cold prefill, same backend)")
    history_ticks(ax, h)
    lo, hi = ax.get_ylim()
    ax.set_ylim(lo / 2.5, hi)  # room for the speedup labels under the lowest points
    # under the panel, below its x label: inside, it covered the lines at every layout tried
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=1, frameon=False)

    ax = axes[2]
    cases = list(result.get("replan_ms") or {})
    x = range(len(cases))
    shared = result.get("replan_ms") or {}
    copied = result.get("copy_fork_replan_ms") or {}
    ax.bar([i - 0.2 for i in x], [shared[c]["p50"] for c in cases], 0.4, label="shared window p50",
           yerr=[[0] * len(cases), [shared[c]["p99"] - shared[c]["p50"] for c in cases]], capsize=3)
    if copied:
        ax.bar([i + 0.2 for i in x], [copied[c]["p50"] for c in cases], 0.4, label="copy per branch p50",
               yerr=[[0] * len(cases), [copied[c]["p99"] - copied[c]["p50"] for c in cases]], capsize=3)
    budget_line(ax)
    ax.set_xticks(list(x), [c.replace("@", "\n@ ") for c in cases])
    ax.set(xlabel="branches x horizon @ kv_window (error bar: p99)", ylabel="ms", title="replan, window full")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


# ---- flashrt-bench ros -------------------------------------------------------------------------------
ROS_KINDS = (("trigger_rtt", "bare Trigger service (floor)"), ("rollback_rtt", "Rollback service"),
             ("replan_rtt", "Replan 4x8 action"), ("step_latency", "observation -> policy_step"))


def cdf(ax, samples, label) -> None:
    import numpy as np
    xs = np.sort(np.asarray(samples, dtype=float))
    ax.step(xs, np.arange(1, xs.size + 1) / xs.size, where="post", label=f"{label} (n={xs.size})")


def bench_ros(result: dict, path) -> Path:
    """CDFs of the four round trips of `flashrt-bench ros` on one log-x figure (needs its samples_ms,
    which the tool keeps when --plot is given)."""
    plt = pyplot()
    samples = result.get("samples_ms") or {}
    if not samples:
        raise ValueError("bench ros result has no samples_ms (run flashrt-bench ros with --plot)")
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for key, label in ROS_KINDS:
        if samples.get(key):
            cdf(ax, samples[key], label)
    budget_line(ax, axis="x")
    ax.set(xscale="log", xlabel="round trip, ms (log)", ylabel="fraction of calls",
           title=f"flashrt-bench ros: {result.get('calls', '?')} calls each, separate processes over DDS")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8, loc="lower right")
    return save(fig, path)


def bench_persist(result: dict, path) -> Path:
    return save(draw_bench_persist(result), path)


def draw_bench_persist(result: dict):
    """`flashrt-bench persist`: step latency with and without the capsule log (CDFs, same run), and the
    records lost at each kill -9 (needs samples_ms, kept when --plot is given)."""
    plt = pyplot()
    samples = result.get("samples_ms") or {}
    if not samples:
        raise ValueError("bench persist result has no samples_ms (run flashrt-bench persist with --plot)")
    fig, (lat, lost) = plt.subplots(1, 2, figsize=(11, 4.2), gridspec_kw={"width_ratios": [3, 2]})
    over = result["persist_step_overhead"]
    for key, label in (("without", "without persistence"), ("with", "with persistence")):
        cdf(lat, samples[key], f"{label} (p99 {over[f'{key}_persistence_ms']['p99']:.2f} ms)")
    from matplotlib.ticker import FormatStrFormatter, NullFormatter

    lat.set(xscale="log", xlabel="step latency, ms (log)", ylabel="fraction of steps",
            title=f"step at 100 Hz, full window: p99 ratio {over['p99_ratio']:.2f}")
    lat.xaxis.set_major_formatter(FormatStrFormatter("%g"))
    lo_ms, hi_ms = min(min(v) for v in samples.values()), max(max(v) for v in samples.values())
    if hi_ms < 10 * lo_ms:  # a narrow log range gets minor ticks only: label them as numbers
        lat.xaxis.set_minor_formatter(FormatStrFormatter("%g"))
    else:  # over a decade, labelled minor ticks run into each other
        lat.xaxis.set_minor_formatter(NullFormatter())
    lat.grid(alpha=0.3, which="both")
    lat.legend(fontsize=8, loc="lower right")
    rounds = result["records_lost_on_kill"]["rounds"]
    # markers on stems, not bars: a bar of height 0 draws nothing, and 0 lost is the result that matters
    x = list(range(1, len(rounds) + 1))
    y = [r["lost"] for r in rounds]
    top = max(2, max(y, default=0) + 1)
    lost.vlines(x, 0, y, color="tab:red", lw=2)
    lost.plot(x, y, "o", color="tab:red", ms=8, label="records lost")
    lost.axhline(0, color="0.5", lw=0.8, zorder=0)
    lost.set(xlabel="kill -9 (round)", ylabel="records lost (count)", ylim=(-0.12 * top, top),
             xlim=(0.4, len(rounds) + 0.6),
             title=f"resume {result['resume_ms']['ms'] / 1e3:.1f} s, "
                   f"{result['persist_mb_per_s']['mib_per_s']:.2f} MiB/s")
    lost.set_xticks(x)
    lost.yaxis.get_major_locator().set_params(integer=True)
    return fig
