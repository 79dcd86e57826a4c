"""The arm mission's figure (`flashrt-demo --plot`): per episode, the hand's path (x, y) as the policy read it
against the goal and the object's start, with each fault's bad readings, its corrected readings and the commit
of its correction replan marked."""
from __future__ import annotations

from pathlib import Path

from .figures import pyplot, save

MAX_EPISODES = 6  # panels; a longer run draws its first six


def arm_trajectory(summary: dict, path) -> Path:
    episodes = summary.get("trajectory")
    if not episodes:
        raise ValueError("the arm mission summary has no trajectory (the planner wrote none: did it start?)")
    episodes = episodes[:MAX_EPISODES]
    plt = pyplot()
    fig, axes = plt.subplots(1, len(episodes), figsize=(4.6 * len(episodes), 4.8), squeeze=False)
    by_episode = {e["episode"]: e for e in summary.get("per_episode", [])}
    for ax, ep in zip(axes[0], episodes):
        hand = ep["hand"]
        t = [h[0] for h in hand]
        ax.plot([h[1] for h in hand], [h[2] for h in hand], color="tab:blue", lw=1, label="hand, as read")
        for i, f in enumerate(ep["faults"]):
            bad = [h for h in hand if f["start_s"] - 1e-6 <= h[0] <= f["end_s"] + 1e-6]
            ax.plot([h[1] for h in bad], [h[2] for h in bad], color="tab:red", lw=2.5,
                    label="fault: bad readings" if i == 0 else None)
            fixed = f["hand_corrected"]
            ax.plot([p[0] for p in fixed], [p[1] for p in fixed], color="tab:green", lw=1.2, ls="--",
                    label="corrected readings" if i == 0 else None)
            at = min(range(len(t)), key=lambda k: abs(t[k] - f["arrived_s"])) if t else None
            if at is not None:
                ax.scatter([hand[at][1]], [hand[at][2]], marker="D" if f["committed"] else "x", s=30, zorder=4,
                           color="tab:green" if f["committed"] else "black",
                           label=("correction committed" if f["committed"] else "correction not committed")
                           if i == 0 else None)
        ax.scatter(*ep["object_start"], marker="s", s=50, color="tab:orange", label="object at start", zorder=3)
        ax.add_patch(plt.Circle(ep["goal"], 0.05, color="tab:purple", alpha=0.25, label="goal (5 cm)"))
        result = by_episode.get(ep["episode"], {})
        outcome = (f"success at {result['success_s']} s" if result.get("success") else "no success")
        ax.set(title=f"episode {ep['episode']}: {len(ep['faults'])} faults, {outcome}", xlabel="x, m",
               ylabel="y, m", aspect="equal")
        ax.legend(fontsize=7, loc="best")
    fig.suptitle(f"flashrt arm mission ({summary.get('backend', '?')}): {summary.get('successes', 0)} / "
                 f"{summary.get('episodes', 0)} successes, {summary.get('replans_committed', 0)} / "
                 f"{summary.get('corrections', 0)} corrections committed")
    fig.tight_layout()
    return save(fig, path)
