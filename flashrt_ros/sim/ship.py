"""The trained Pusher policy into the repository: flashrt-train's file, with the sim's channel names, at DST.

    python -m flashrt_ros.sim.ship RUN_DIR DST      (make train-policy)

flashrt-train names a Float32MultiArray's channels by nothing, so the shipped file gets the sim's observation
names (world.OBS_NAMES) and the arm's joints as action names; a file of another shape or other joints is refused.
Prints the run's validation loss (report.json) beside the mean action's.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from ..runtime.model.policy_file import config_from_policy, read_policy, save_policy
from .world import ARM_JOINTS, OBS_NAMES

POLICY_FILE = "policy.safetensors"  # flashrt-train's output name in its --out directory
REPORT_FILE = "report.json"


def ship_policy(run_dir: str | Path, dst: str | Path) -> dict:
    """Writes dst; returns the run's report (its validation losses)."""
    src = Path(run_dir) / POLICY_FILE
    pf = read_policy(src)
    cfg = config_from_policy(src)
    if (cfg.obs_dim, cfg.action_dim) != (len(OBS_NAMES), len(ARM_JOINTS)):
        raise ValueError(f"{src}: obs_dim {cfg.obs_dim} / action_dim {cfg.action_dim}, not the arm's "
                         f"{len(OBS_NAMES)} / {len(ARM_JOINTS)}")
    if pf.action_names and tuple(pf.action_names) != ARM_JOINTS:
        raise ValueError(f"{src}: actions {list(pf.action_names)}, not the arm's joints {list(ARM_JOINTS)}")
    Path(dst).parent.mkdir(parents=True, exist_ok=True)
    save_policy(dst, cfg, pf.tensors, OBS_NAMES, ARM_JOINTS)
    return json.loads((Path(run_dir) / REPORT_FILE).read_text())


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    report = ship_policy(*argv)
    size = Path(argv[1]).stat().st_size
    print(f"{argv[1]}: {size / 2**20:.2f} MiB; validation loss {report['best_val_loss']:.5f} at step "
          f"{report['best_step']} (the mean action's {report['baseline_val_loss']:.5f}: "
          f"{report['val_over_baseline']:.1%} of it)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
