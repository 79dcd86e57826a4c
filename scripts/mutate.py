#!/usr/bin/env python3
"""`make mutate`: break the code on purpose, one named mutation at a time, and check a test notices.

Each mutation (test/mutations.py) replaces one exact snippet in one file of a scratch copy of the
working tree, runs the tests that should catch it, and counts it caught when they fail. A snippet
that is missing or not unique is an error, so the list cannot silently go stale. Exit status 0 only
when every mutation is caught. Not part of `make test`: it reruns test files once per mutation.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "test"))


def scratch_copy(dst: Path) -> None:
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, check=True,
                           capture_output=True, text=True).stdout.split("\n")
    for f in filter(None, files):
        src = ROOT / f
        if src.is_file():
            (dst / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst / f)


def run_tests(scratch: Path, tests: list[str], timeout: float) -> tuple[bool, str]:
    env = dict(os.environ, PYTHONPATH=str(scratch), PYTHONDONTWRITEBYTECODE="1", FLASHRT_HYPOTHESIS_PROFILE="mutate")
    python = sys.executable
    if any(Path(t.split("::")[0]).name.startswith("test_train_") for t in tests):
        python = str(ROOT / ".venv-train" / "bin" / "python")  # PyTorch lives there alone (make test-train)
        if not Path(python).exists():
            return False, "needs .venv-train (run make test-train once): not run, so not caught"
    cmd = [python, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *tests]
    try:
        res = subprocess.run(cmd, cwd=scratch, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return True, "timed out (counted as caught: the mutation hangs the tests)"
    tail = (res.stdout.strip().splitlines() or [""])[-1]
    return res.returncode != 0, tail


def main(argv=None) -> int:
    from mutations import MUTATIONS

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("names", nargs="*", help="run only these mutations (default: all)")
    ap.add_argument("--list", action="store_true", help="list the mutations and exit")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds per mutation's test run")
    args = ap.parse_args(argv)
    chosen = [m for m in MUTATIONS if not args.names or m.name in args.names]
    if args.list:
        for m in MUTATIONS:
            print(f"{m.name:36s} {m.file}: {m.why}")
        return 0
    unknown = set(args.names) - {m.name for m in MUTATIONS}
    if unknown:
        print(f"mutate: unknown mutation(s) {sorted(unknown)}; see --list", file=sys.stderr)
        return 2
    results = []
    with tempfile.TemporaryDirectory(prefix="flashrt-mutate.") as tmp:
        scratch = Path(tmp)
        scratch_copy(scratch)
        for i, m in enumerate(chosen, 1):
            path = scratch / m.file
            original = path.read_text()
            hits = original.count(m.old)
            if hits != 1:
                results.append((m, "STALE", f"snippet found {hits} times in {m.file}"))
                continue
            path.write_text(original.replace(m.old, m.new))
            t0 = time.perf_counter()
            print(f"[{i}/{len(chosen)}] {m.name} ...", file=sys.stderr, flush=True)
            try:
                caught, tail = run_tests(scratch, m.tests, args.timeout)
            finally:
                path.write_text(original)
            results.append((m, "caught" if caught else "SURVIVED", f"{tail} ({time.perf_counter() - t0:.0f} s)"))
    width = max(len(m.name) for m, _, _ in results)
    for m, verdict, detail in results:
        print(f"{m.name:{width}s}  {verdict:8s}  {detail}")
    bad = [m.name for m, v, _ in results if v != "caught"]
    print(f"{len(results) - len(bad)} caught, {len(bad)} not caught" + (f": {', '.join(bad)}" if bad else ""))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
