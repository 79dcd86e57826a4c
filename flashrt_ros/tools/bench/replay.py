"""`flashrt-bench replay`: offline replay throughput on a synthetic 100 Hz JointState bag."""
from __future__ import annotations

import json
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

from ..common import progress, synthetic_trace
from ..replay.bags import write_joint_trace

RATE_HZ = 100.0


def run(args) -> dict:
    with tempfile.TemporaryDirectory(prefix="flashrt-bench-replay.") as tmp:
        bag = Path(tmp) / "bag"
        progress(f"writing a {args.steps}-step JointState bag (mcap)")
        write_joint_trace(bag, "mcap", synthetic_trace(args.steps, 14))
        progress("flashrt-replay offline (progress every 2000 messages)")
        res = subprocess.run([sys.executable, "-m", "flashrt_ros.tools.replay", str(bag)],
                             stdout=subprocess.PIPE, text=True)  # its progress lines go to our stderr
        if res.returncode:
            raise SystemExit(f"flashrt-replay failed with exit code {res.returncode}")
        summary = json.loads(res.stdout)
    # the replay is this process's only child: its peak RSS (KiB on Linux), which streaming keeps flat
    peak_rss_mb = round(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024, 1)
    steps_per_s = summary["steps_per_s"]
    return {"steps": summary["steps"], "steps_per_s": steps_per_s,
            "real_time_factor_at_100hz": round(steps_per_s / RATE_HZ, 2),
            "step_latency_ms": summary["step_latency_ms"], "actions_sha256": summary["actions_sha256"],
            "replay_peak_rss_mb": peak_rss_mb}
