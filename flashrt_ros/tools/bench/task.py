"""flashrt-bench task: issue 46's task figures (sim/mission.py), offline: the expert and the trained policy on
the Pusher, sensor faults with and without the rollback correction, and what-if selection under a biased object
estimate, over the same seeded held-out episodes. Needs the `sim` extra (MuJoCo)."""
from __future__ import annotations

import sys


def run(args) -> dict:
    # the one import of the sim from tools (.importlinter): here, when `task` runs, so MuJoCo stays optional
    from ...sim.mission import run_mission

    return run_mission(args.policy, args.episodes, args.first_seed, args.seconds, args.backend,
                       progress=lambda part: print(f"flashrt-bench task: {part}", file=sys.stderr, flush=True))
