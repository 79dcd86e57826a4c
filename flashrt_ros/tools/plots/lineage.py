"""The capsule tree of a mission (`flashrt-bench capsules --plot`): x is the policy step, each lane a
branch. The live timeline is the thick path from the first capsule to the live one; a rollback starts
a new lane from the capsule it went back to; replan branches are short orange lanes (the committed one
continues as the live timeline); pins are stars; evicted capsules are grey."""
from __future__ import annotations

from pathlib import Path

from .figures import pyplot, save


def assign_lanes(capsules: list[dict]) -> dict[int, int]:
    """A capsule continues its parent's lane when it is the parent's first timeline child; any other
    child (a rollback's new future, a replan branch) opens a new lane. Capsules in id (= creation) order."""
    lane: dict[int, int] = {}
    continued: set[int] = set()
    for c in sorted(capsules, key=lambda c: c["id"]):
        p = c["parent_id"]
        is_branch = c["label"].startswith("replan branch")
        if p in lane and p not in continued and not is_branch:
            lane[c["id"]] = lane[p]
            continued.add(p)
        else:
            lane[c["id"]] = max(lane.values(), default=-1) + 1
    return lane


def live_path(capsules: dict[int, dict], live: int) -> set[int]:
    path, cid = set(), live
    while cid in capsules and cid not in path:
        path.add(cid)
        cid = capsules[cid]["parent_id"]
    return path


def capsule_lineage(result: dict, path) -> Path:
    plt = pyplot()
    caps = {c["id"]: c for c in result["capsules"]}
    lane = assign_lanes(list(caps.values()))
    live = live_path(caps, result.get("live_capsule", 0))
    committed = {e["branch_capsules"][e["committed"]] for e in result.get("events", [])
                 if e["kind"] == "replan" and e.get("committed") is not None}
    fig, ax = plt.subplots(figsize=(11, 0.5 * max(lane.values(), default=0) + 3))

    for c in caps.values():  # one edge per capsule, from its parent
        p = caps.get(c["parent_id"])
        if p is None:
            continue
        xs, ys = [p["step"], c["step"]], [lane[p["id"]], lane[c["id"]]]
        if ys[0] != ys[1]:  # a branch: leave the parent's lane right away
            xs, ys = [p["step"], p["step"], c["step"]], [ys[0], ys[1], ys[1]]
        on_live = c["id"] in live and p["id"] in live
        branch = c["label"].startswith("replan branch")
        color = "black" if on_live else ("0.75" if c["evicted"] else ("tab:orange" if branch else "tab:blue"))
        ax.plot(xs, ys, color=color, lw=2.5 if on_live else 1.2, zorder=2 if on_live else 1)

    def scatter(sel, **kw):
        pts = [(c["step"], lane[c["id"]]) for c in caps.values() if sel(c)]
        if pts:
            ax.scatter(*zip(*pts), **kw)

    scatter(lambda c: not c["evicted"] and not c["label"], s=6, color="tab:blue", zorder=3,
            label="capsule held")
    scatter(lambda c: c["evicted"], s=8, marker="x", color="0.6", zorder=3, label="capsule evicted")
    scatter(lambda c: c["label"].startswith("replan branch") and c["id"] not in committed and not c["evicted"], s=40,
            color="tab:orange", zorder=4, label="replan branch (what-if)")
    scatter(lambda c: c["label"].startswith("replan branch") and c["evicted"], s=40, color="0.6", zorder=4,
            label="replan branch, evicted")
    scatter(lambda c: c["id"] in committed, s=60, marker="D", color="tab:green", zorder=4,
            label="replan branch committed")
    scatter(lambda c: c["ever_pinned"], s=220, marker="*", color="gold", edgecolors="k", zorder=5,
            label="pinned")
    first = True
    for e in result.get("events", []):
        if e["kind"] == "rollback" and e["to_capsule"] in caps:
            ax.annotate("", (e["to_step"], lane[e["to_capsule"]]), textcoords="offset points", xytext=(0, 22),
                        arrowprops=dict(arrowstyle="->", color="tab:red", lw=1.5))
            ax.scatter([e["to_step"]], [lane[e["to_capsule"]]], s=50, facecolors="none", edgecolors="tab:red",
                       zorder=5, label="rollback target" if first else None)
            first = False
    c = caps.get(result.get("live_capsule"))
    if c:
        ax.scatter([c["step"]], [lane[c["id"]]], s=90, color="black", zorder=6, label="live capsule")
    ax.plot([], [], color="black", lw=2.5, label="live timeline")
    ax.set(xlabel="policy step", ylabel="branch (lane)",
           title=f"capsule lineage: {result.get('capsules_seen', len(caps))} capsules, {result.get('evicted', 0)} "
                 f"evicted, {result.get('held', '?')} held of {result.get('capacity', '?')} records")
    ax.set_yticks(sorted(set(lane.values())))
    ax.invert_yaxis()
    ax.grid(alpha=0.2)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return save(fig, path)
