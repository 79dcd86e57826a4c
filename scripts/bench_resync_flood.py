#!/usr/bin/env python3
"""Issue 44.6: does a flood of capsule-stream resync requests slow the robot down? A Session of the default
model streams every record (encoded on the stream thread, as the node's does) while it steps back to back;
blocks with a client calling request_resync() at --hz alternate with quiet blocks (the same run, so the
machine's load hits both alike). Prints steps/s of each side, their ratio and the keyframes each side sent.

    .venv/bin/python scripts/bench_resync_flood.py [--blocks 6] [--block-s 2] [--hz 80] [--backend cpu]
"""
from __future__ import annotations

import argparse
import json
import threading
import time

from flashrt_ros.runtime import PolicyConfig, Session
from flashrt_ros.runtime.persist.format import RESYNC
from flashrt_ros.tools.common import synthetic_trace


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--blocks", type=int, default=6, help="block pairs (flood, quiet), alternating")
    ap.add_argument("--block-s", type=float, default=2.0)
    ap.add_argument("--hz", type=float, default=80.0, help="resync requests per second in a flood block")
    ap.add_argument("--backend", default="cpu")
    args = ap.parse_args(argv)
    s = Session(PolicyConfig(capsule_budget_mb=128.0), args.backend)
    kinds: list[int] = []
    stream = s.enable_stream(lambda rec: kinds.append(rec.kind))  # the record is encoded before publish
    obs = synthetic_trace(4096, s.cfg.obs_dim, seed=1)
    for o in obs[:200]:  # warm-up (compile, caches)
        s.step(o)
    stream.flush()
    flooding = threading.Event()
    stop = threading.Event()

    def client():
        while not stop.is_set():
            if flooding.is_set():
                stream.request_resync()
            time.sleep(1.0 / args.hz)

    t = threading.Thread(target=client, daemon=True)
    t.start()
    side = {"flood": [0, 0.0, 0], "quiet": [0, 0.0, 0]}  # steps, seconds, keyframes
    i = 0
    try:
        for b in range(2 * args.blocks):
            name = "flood" if b % 2 == 0 else "quiet"
            (flooding.set if name == "flood" else flooding.clear)()
            stream.flush()
            k0 = len(kinds)
            t0 = time.perf_counter()
            n = 0
            while time.perf_counter() - t0 < args.block_s:
                s.step(obs[i % len(obs)])
                i += 1
                n += 1
            flooding.clear()
            stream.flush()
            side[name][0] += n
            side[name][1] += time.perf_counter() - t0
            side[name][2] += sum(k == RESYNC for k in kinds[k0:])
    finally:
        stop.set()
        t.join()
        s.disable_stream()
    rate = {k: v[0] / v[1] for k, v in side.items()}
    print(json.dumps({"backend": s.backend.name, "request_hz": args.hz, "blocks": args.blocks, "block_s": args.block_s,
                      "steps_per_s": {k: round(v, 1) for k, v in rate.items()},
                      "flood_over_quiet": round(rate["flood"] / rate["quiet"], 4),
                      "keyframes": {k: v[2] for k, v in side.items()},
                      "seconds": {k: round(v[1], 1) for k, v in side.items()}}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
