#!/usr/bin/env python3
"""`make reproduce`: rerun every benchmark behind a documented number (docs/results.md) and compare.

Those numbers live in docs/readme_numbers.json (test/test_readme_numbers.py checks that docs/results.md and
the README's headline table say exactly what that file says; the name is from when the tables were in the
README). Each benchmark a table needs runs once, its JSON goes to out/bench_<bench>.json; then one
out/reproduce_<table>.json per results table, and a printed table: the documented value (column "README"),
the fresh value, fresh / documented. GPU tables are skipped, with the reason, when there
is no usable CUDA device. Progress goes to stderr. Exit status 0 when every bench that ran succeeded
(the numbers themselves are reported, never judged: these machines are noisy).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NUMBERS = ROOT / "docs" / "readme_numbers.json"
_SELECT = re.compile(r"^(?P<key>[^\[]+)\[(?P<field>\w+)=(?P<value>[^\]]+)\]$")


def progress(msg: str) -> None:
    print(f"[reproduce] {msg}", file=sys.stderr, flush=True)


def lookup(data, path: str):
    """The value at a dotted path; `list[field=value]` picks the list item whose field equals value.
    None where any part is missing."""
    cur = data
    for part in path.split("."):
        m = _SELECT.match(part)
        key = m["key"] if m else part
        if not isinstance(cur, dict) or key not in cur:
            return None
        cur = cur[key]
        if m:
            cur = next((it for it in cur if isinstance(it, dict) and str(it.get(m["field"])) == m["value"]), None)
            if cur is None:
                return None
    return cur


def bench_commands(duration_s: float) -> dict[str, list[str]]:
    py = [sys.executable, "-m"]
    return {"runtime": py + ["flashrt_ros.tools.bench", "runtime"],
            "ros": py + ["flashrt_ros.tools.bench", "ros"],
            "persist": py + ["flashrt_ros.tools.bench", "persist"],
            "stream": py + ["flashrt_ros.tools.bench", "stream"],
            "demo": py + ["flashrt_ros.tools.demo", "--mission", "trace", "--duration", f"{duration_s:g}"],
            "gpu": py + ["flashrt_ros.tools.bench", "gpu"],
            "runtime_cuda": py + ["flashrt_ros.tools.bench", "runtime", "--backend", "cuda"]}


GPU_BENCHES = ("gpu", "runtime_cuda")  # skipped, not failed, without a CUDA device


def compare(spec: dict, table: str, fresh: dict | None, skipped: str | None = None) -> dict:
    """One README table's numbers next to a fresh bench JSON (None: not run, `skipped` says why)."""
    rows = []
    for n in spec["numbers"]:
        if n["table"] != table:
            continue
        value = None if fresh is None else lookup(fresh, n["path"])
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            value = value * n.get("scale", 1)
        else:
            value = None
        ratio = round(value / n["value"], 3) if value is not None and n["value"] else None
        rows.append({"id": n["id"], "readme": n["value"], "readme_text": n["text"], "fresh": value, "ratio": ratio,
                     "path": n["path"], "scale": n.get("scale", 1)})
    t = spec["tables"][table]
    return {"table": table, "readme_heading": t["heading"], "bench": t["bench"], "readme_conditions": t["conditions"],
            "skipped": skipped, "rows": rows}


def format_table(result: dict) -> str:
    head = f"{result['table']}  ({result['readme_heading']}; README: {result['readme_conditions']})"
    if result["skipped"]:
        return f"{head}\n  skipped: {result['skipped']}"
    w = max([len(r["id"]) for r in result["rows"]] + [2])
    lines = [head, f"  {'id'.ljust(w)}  {'README':>10}  {'fresh':>10}  {'ratio':>7}"]
    for r in result["rows"]:
        fresh = "missing" if r["fresh"] is None else f"{r['fresh']:.4g}"
        ratio = "-" if r["ratio"] is None else f"{r['ratio']:.2f}"
        lines.append(f"  {r['id'].ljust(w)}  {r['readme']:>10.4g}  {fresh:>10}  {ratio:>7}")
    return "\n".join(lines)


def machine_line(machine: dict | None) -> str:
    """The fresh run's machine in one line (bench JSON `machine` block, tools/machine.py)."""
    if not machine:
        return "machine not recorded"
    blas = ", ".join(f"{b.get('internal_api')} {b.get('version')}" for b in machine.get("blas") or []) or "BLAS ?"
    load = "/".join(f"{x:g}" for x in machine.get("load_avg_before") or []) or "?"
    after = "/".join(f"{x:g}" for x in machine.get("load_avg_after") or []) or "?"
    return (f"{machine.get('cpu_model')} ({machine.get('cores')} cores), load {load} before, {after} after, "
            f"backend {machine.get('backend')}, numpy {machine.get('numpy')} ({blas}), numba {machine.get('numba')}, "
            f"cupy {machine.get('cupy')}")


def gpu_unavailable() -> str | None:
    from flashrt_ros.runtime.engine.backend import cuda_probe
    return cuda_probe()


def run_bench(name: str, cmd: list[str], out: Path) -> tuple[dict | None, str | None]:
    dest = out / f"bench_{name}.json"
    progress(f"{name}: load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores (other load skews the numbers)")
    progress(f"{name}: {' '.join(cmd[1:])} --json {dest.relative_to(ROOT) if dest.is_relative_to(ROOT) else dest}")
    t0 = time.monotonic()
    res = subprocess.run(cmd + ["--json", str(dest)], cwd=ROOT, stdout=subprocess.DEVNULL)  # progress: stderr
    if res.returncode or not dest.exists():
        return None, f"the {name} bench failed (exit code {res.returncode})"
    progress(f"{name}: done in {time.monotonic() - t0:.0f} s")
    return json.loads(dest.read_text()), None


def main(argv=None) -> int:
    spec = json.loads(NUMBERS.read_text())
    ap = argparse.ArgumentParser(prog="reproduce", description=__doc__.splitlines()[0])
    ap.add_argument("--tables", help=f"comma-separated subset of {','.join(spec['tables'])} (default: all)")
    ap.add_argument("--out", default=str(ROOT / "out"), help="where the JSON goes (default out/)")
    ap.add_argument("--demo-duration", type=float, default=60.0,
                    help="mission length in seconds (default 60; the README's soak ran 600: latencies compare, "
                    "counts are not rerun)")
    ap.add_argument("--results", default=str(ROOT / "docs" / "results" / "reproduced"),
                    help="where each fresh bench JSON (with its machine block) is also saved (default "
                    "docs/results/reproduced/)")
    ap.add_argument("--list", action="store_true", help="print the plan (tables, benches, commands) and exit")
    args = ap.parse_args(argv)
    tables = [t for t in (args.tables or ",".join(spec["tables"])).split(",") if t]
    unknown = sorted(set(tables) - set(spec["tables"]))
    if unknown:
        ap.error(f"unknown table(s) {', '.join(unknown)}; known: {', '.join(spec['tables'])}")
    cmds = bench_commands(args.demo_duration)
    benches = list(dict.fromkeys(spec["tables"][t]["bench"] for t in tables))
    if args.list:
        for b in benches:
            names = ", ".join(t for t in tables if spec["tables"][t]["bench"] == b)
            print(f"{b}: {' '.join(cmds[b][1:])}  ->  tables {names}")
        return 0
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    fresh, why, load = {}, {}, {}
    for i, b in enumerate(benches, 1):
        progress(f"bench {i}/{len(benches)}: {b}")
        if b in GPU_BENCHES and (reason := gpu_unavailable()):
            fresh[b], why[b] = None, f"no usable CUDA device ({reason})"
            progress(f"{b}: skipped: {why[b]}")
            continue
        load[b] = round(os.getloadavg()[0], 2)
        fresh[b], why[b] = run_bench(b, cmds[b], out)
    failed = False
    for t in tables:
        b = spec["tables"][t]["bench"]
        result = compare(spec, t, fresh[b], why[b])
        result["load_avg_1min_at_start"], result["cpu_count"] = load.get(b), os.cpu_count()
        result["machine"] = (fresh[b] or {}).get("machine")
        result["readme_machine"] = spec["tables"][t].get("machine", "not recorded")
        failed |= fresh[b] is None and b not in GPU_BENCHES
        (out / f"reproduce_{t}.json").write_text(json.dumps(result, indent=2) + "\n")
        print(format_table(result), flush=True)
        if not result["skipped"]:
            print(f"  README machine: {result['readme_machine']}\n"
                  f"  fresh machine:  {machine_line(result['machine'])}\n", flush=True)
    saved = Path(args.results)
    for b, data in fresh.items():
        if data is not None:
            saved.mkdir(parents=True, exist_ok=True)
            (saved / f"bench_{b}.json").write_text(json.dumps(data, indent=2) + "\n")
    for t in spec.get("not_rerun", []):
        print(f"not rerun ({t['table']}): {t['row'].strip('| ')}: {t['why']}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
