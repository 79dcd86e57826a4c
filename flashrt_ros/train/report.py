"""flashrt-train's report: report.json (losses per evaluation, the mean-action baseline, steps, time, the data) and
report.png (the loss curves, and predicted vs recorded actions on a held-out bag). NumPy and matplotlib only."""
from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np

REPORT_KEYS = ("status", "steps", "train_seconds", "steps_per_second", "history", "best_step", "best_val_loss",
               "baseline_val_loss", "val_over_baseline", "deployed", "data", "model", "options", "policy")


def deployed_errors(predicted: Sequence[np.ndarray], episodes, mean_action: np.ndarray) -> dict:
    """Robot-unit errors of whole held-out bags run from their start, as the node runs them (blended actions),
    beside the mean training action's: RMSE per channel and over all, on the paired steps."""
    se, se_mean, n = 0.0, 0.0, 0
    per = np.zeros(len(mean_action))
    for p, e in zip(predicted, episodes):
        rec, v = e.actions[e.valid].astype(np.float64), e.valid
        d = p[v] - rec
        per += (d ** 2).sum(0)
        se += float((d ** 2).sum())
        se_mean += float(((rec - mean_action) ** 2).sum())
        n += int(v.sum())
    count = max(1, n * len(mean_action))
    return {"rmse": float(np.sqrt(se / count)), "mean_action_rmse": float(np.sqrt(se_mean / count)),
            "rmse_per_channel": [float(x) for x in np.sqrt(per / max(1, n))], "steps": n}


def write_json(path: Path, report: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(report, indent=2) + "\n")
    tmp.replace(path)


def plot(path: Path, history: list, baseline: float, bag: str, period_s: float, recorded: np.ndarray,
         predicted: np.ndarray, action_names: Sequence[str] = (), max_channels: int = 8) -> None:
    """The loss curves (log scale, the baseline dashed) over predicted vs recorded actions of one bag."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    chans = min(recorded.shape[1], max_channels)
    rows = 1 + (chans + 1) // 2
    fig = plt.figure(figsize=(11, 2.6 * rows))
    ax = fig.add_subplot(rows, 1, 1)
    steps = [h["step"] for h in history]
    ax.plot(steps, [h["train_loss"] for h in history], label="train (last 50 steps)")
    ax.plot(steps, [h["val_loss"] for h in history], label="validation")
    ax.axhline(baseline, color="gray", ls="--", label="mean action (validation)")
    ax.set_yscale("log")
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("MSE (normalised actions)")
    ax.legend(fontsize=8)
    t = np.arange(len(recorded)) * period_s
    for c in range(chans):
        a = fig.add_subplot(rows, 2, 3 + c)
        a.plot(t, recorded[:, c], lw=1.2, label="recorded")
        a.plot(t, predicted[:, c], lw=1.0, ls="--", label="policy")
        a.set_title(action_names[c] if c < len(action_names) else f"action {c}", fontsize=9)
        a.tick_params(labelsize=7)
        if c >= chans - 2:
            a.set_xlabel("s", fontsize=8)
        if c == 0:
            a.legend(fontsize=7)
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    fig.suptitle(f"held-out bag {bag}: actions in robot units, the policy run from the bag's start", fontsize=10)
    fig.savefig(path, dpi=90)
    plt.close(fig)
