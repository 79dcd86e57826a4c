"""flashrt-demo: the mission through ROS 2 (default), or the ROS-free runtime demo (`--runtime`)."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="flashrt-demo", description=__doc__)
    ap.add_argument("--runtime", action="store_true", help="the runtime demo only, no ROS processes")
    ap.add_argument("--duration", type=float, default=20.0, help="mission length in seconds (ROS demo)")
    ap.add_argument("--steps", type=int, default=300, help="trace length (runtime demo)")
    ap.add_argument("--backend", default="numpy", choices=["numpy", "cuda", "auto"])
    ap.add_argument("--config", help="params file (default: the shipped config/flashrt.yaml values)")
    ap.add_argument("--json", help="write the summary JSON here")
    args = ap.parse_args(argv)
    if args.runtime:
        from .demo_runtime import run
    else:
        from .demo_mission import run
    try:
        summary = run(args)
    except KeyboardInterrupt:
        return 130
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(summary, indent=2) + "\n")
    return 0 if summary.get("ok", True) else 1


if __name__ == "__main__":
    sys.exit(main())
