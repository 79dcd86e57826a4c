#!/usr/bin/env python3
"""`make mutate`: break the code on purpose, one named mutation at a time, and check a test notices.

Each mutation (test/mutations.py) replaces one exact snippet in one file of a scratch copy of the
working tree, runs the tests that should catch it, and counts it caught when they fail. A snippet
that is missing or not unique is an error, so the list cannot silently go stale. Exit status 0 only
when every mutation is caught. Not part of `make test`: it reruns test files once per mutation.

The whole list takes hours, so a change runs the mutations of what it touched: ``--changed [BASE]`` picks those
whose file differs from the merge-base with BASE (default main), ``--module PATH`` those of a file or a folder.
The map from modules to mutations is each mutation's ``file``: there is no second table to keep.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "test"))
LIST = "test/mutations.py"


def scratch_copy(dst: Path) -> None:
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, check=True,
                           capture_output=True, text=True).stdout.split("\n")
    for f in filter(None, files):
        src = ROOT / f
        if src.is_file():
            (dst / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst / f)
    if (ROOT / ".venv").is_dir():  # tests that run the node venv's scripts from another venv (test_train_sim_*)
        (dst / ".venv").symlink_to(ROOT / ".venv")  # PYTHONPATH still puts the mutated tree first there


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


def git(*args: str, cwd: Path = ROOT) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout


def changed_files(base: str, cwd: Path = ROOT) -> set[str]:
    """Paths (from the repository's root) that differ between the merge-base of HEAD and ``base`` and the working
    tree: committed, staged or not, and new files git does not ignore."""
    merge_base = git("merge-base", "HEAD", base, cwd=cwd).strip()
    return set(filter(None, git("diff", "--name-only", merge_base, cwd=cwd).splitlines()
                      + git("ls-files", "--others", "--exclude-standard", cwd=cwd).splitlines()))


def mutations_at(base: str, cwd: Path = ROOT) -> list:
    """test/mutations.py's list as the merge-base with ``base`` had it ([] where it had none)."""
    merge_base = git("merge-base", "HEAD", base, cwd=cwd).strip()
    try:
        text = git("show", f"{merge_base}:{LIST}", cwd=cwd)
    except subprocess.CalledProcessError:
        return []
    module = types.ModuleType("mutations_at_base")
    sys.modules[module.__name__] = module  # dataclasses look their module up while the class is made
    try:
        exec(compile(text, f"{merge_base[:12]}:{LIST}", "exec"), module.__dict__)  # noqa: S102 - our own list
    finally:
        del sys.modules[module.__name__]
    return module.MUTATIONS


def entry(m) -> tuple:
    return m.name, m.file, m.old, m.new, tuple(m.tests)


def select(mutations: list, names: list[str], modules: list[str], changed: set[str] | None = None,
           before: list | None = None) -> list:
    """The mutations named, of a module given (a file, or a folder: every file under it), or touched by a change:
    ``changed`` holds the files it changed (a mutation's file or one of its test files), ``before`` the list
    before it (an entry new or edited since). Every mutation when nothing selects; list order is kept."""
    if not names and not modules and changed is None:
        return list(mutations)
    folders = tuple(m.rstrip("/") + "/" for m in modules)
    changed, old = changed or set(), {entry(m) for m in before} if before is not None else None

    def touched(m) -> bool:
        return (m.file in changed or any(t.split("::")[0] in changed for t in m.tests)
                or old is not None and entry(m) not in old)

    return [m for m in mutations if m.name in names or m.file in modules or m.file.startswith(folders) or touched(m)]


def repo_path(p: str) -> str:
    """A file or folder given on the command line, as a path from the repository's root."""
    try:
        return Path(p).resolve().relative_to(ROOT).as_posix()
    except ValueError:
        raise SystemExit(f"mutate: {p} is outside the repository {ROOT}") from None


def main(argv=None) -> int:
    from mutations import MUTATIONS

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("names", nargs="*", help="run only these mutations (also comma-separated; default: all)")
    ap.add_argument("--module", action="append", default=[], metavar="PATH",
                    help="the mutations of this file, or of every file under this folder (repeatable)")
    ap.add_argument("--changed", nargs="?", const="main", metavar="BASE",
                    help="the mutations of the files changed since the merge-base with BASE (default: main)")
    ap.add_argument("--list", action="store_true", help="list the selected mutations and exit")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds per mutation's test run")
    args = ap.parse_args(argv)
    names = [n for arg in args.names for n in arg.split(",") if n]
    unknown = set(names) - {m.name for m in MUTATIONS}
    if unknown:
        print(f"mutate: unknown mutation(s) {sorted(unknown)}; see --list", file=sys.stderr)
        return 2
    modules = [repo_path(p) for p in args.module]
    try:
        changed = changed_files(args.changed) if args.changed else None
        before = mutations_at(args.changed) if changed is not None and LIST in changed else None
    except subprocess.CalledProcessError as e:
        print(f"mutate: --changed {args.changed}: {e.stderr.strip() or e}", file=sys.stderr)
        return 2
    chosen = select(MUTATIONS, names, modules, changed, before)
    if args.list:
        for m in chosen:
            print(f"{m.name:36s} {m.file}: {m.why}")
        return 0
    if not chosen:
        print("mutate: no mutation of the selected files or modules: nothing to run")
        return 0
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
