"""flashrt-replay over a corpus of bags: every bag of a directory or glob replayed offline in parallel worker
processes (or as Ray tasks), each as `flashrt-replay BAG` would, and one summary (JSON and a table).

    flashrt-replay DIR_OR_GLOB [--jobs N | --ray auto|ADDRESS] [-o OUT_DIR] [--reference REF_DIR] [--json PATH]

Each bag runs in its own process (a crash or a bad bag costs that bag only); its row gives its steps,
rollback checks, first divergence from REF_DIR/<bag name> and its own exit code. Exit code of the corpus: 0
when every bag's is 0, 1 when any bag's is not (the rows say which and why), 2 when the corpus itself is
bad input (nothing matched, two bags of one name, OUT_DIR exists, no REF_DIR, ray not installed).
"""
from __future__ import annotations

import concurrent.futures as cf
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from ..common import progress
from .bags import STORAGE_SUFFIXES, BagError, check_json_output
from .stream import STOP, Interrupted

RAY_HINT = "--ray needs Ray: pip install 'flashrt_ros[ray]' (or pip install ray)"


# ---- which bags ---------------------------------------------------------------------------------------
def _storage_files(d: Path) -> list[Path]:
    return [p for p in d.iterdir() if p.suffix in STORAGE_SUFFIXES and p.is_file()]


def is_bag(path: Path) -> bool:
    """A rosbag2 directory (metadata.yaml or storage files in it) or one storage file."""
    if path.is_dir():
        return (path / "metadata.yaml").is_file() or bool(_storage_files(path))
    return path.suffix in STORAGE_SUFFIXES


def is_corpus(spec: str) -> bool:
    """A glob that is no path, or a directory without metadata.yaml that holds bag directories or more than
    one storage file (a directory with one .mcap and nothing else stays one bag, as before)."""
    p = Path(spec)
    if not p.exists():
        return glob.has_magic(spec)
    if not p.is_dir() or (p / "metadata.yaml").is_file():
        return False
    return len(_storage_files(p)) > 1 or any(c.is_dir() and is_bag(c) for c in p.iterdir())


def bag_name(path: Path) -> str:
    return path.name if path.is_dir() or path.suffix not in STORAGE_SUFFIXES else path.stem


def find_bags(spec: str) -> list[Path]:
    """The bags of a directory (its bag subdirectories and storage files) or of a glob, by name."""
    p = Path(spec)
    if p.is_dir() and not (p / "metadata.yaml").is_file():  # its bag directories and loose storage files
        found = [c for c in p.iterdir() if not c.name.startswith(".") and is_bag(c)]
    elif p.exists():
        found = [p]
    else:
        found = [Path(m) for m in glob.glob(spec) if is_bag(Path(m))]
    if not found:
        raise BagError(f"{spec}: no bag here (a rosbag2 directory or a .mcap / .db3 file)")
    names: dict[str, Path] = {}
    for b in found:
        other = names.setdefault(bag_name(b), b)
        if other != b:
            raise BagError(f"{spec}: two bags named {bag_name(b)!r} ({other} and {b}); outputs and references "
                           "are matched by bag name, rename one")
    return [_absolute(names[n]) for n in sorted(names)]


def _absolute(path: Path) -> Path:
    """Resolved through its links; a link loop stays as it is named (its worker refuses it: one failed row)."""
    try:
        return path.resolve()
    except (OSError, RuntimeError):  # RuntimeError: Python < 3.13's "Symlink loop"
        return path.absolute()


class Workers:
    """The worker processes running now, so that an interrupt stops each one and no new one starts after."""

    def __init__(self):
        self._lock = threading.Lock()
        self._procs: set = set()
        self._closed = False

    def start(self, cmd: list[str]) -> subprocess.Popen:
        with self._lock:
            if self._closed:
                raise Interrupted(STOP.signum or 15)
            proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    text=True)
            self._procs.add(proc)
            return proc

    def done(self, proc) -> None:
        with self._lock:
            self._procs.discard(proc)

    def stop_all(self, grace_s: float = 10.0) -> None:
        """SIGTERM each (it removes its unfinished output bag, as flashrt-replay does), then wait for it."""
        with self._lock:
            self._closed = True
            procs = list(self._procs)
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


# ---- one bag, in a worker ----------------------------------------------------------------------------------
def replay_one(job: dict, running: Workers | None = None) -> dict:
    """Replay one bag as a separate `flashrt-replay` process (and diff it against its reference); a row.
    Runs in a local worker thread or as a Ray task: everything it needs is in `job`."""
    t0 = time.monotonic()
    row = {"bag": job["name"], "path": job["bag"], "exit_code": None, "steps": None, "messages": None,
           "checks": None, "actions_sha256": None, "reference": None, "first_divergence": None, "error": None}
    tmp = tempfile.mkdtemp(prefix="flashrt-corpus.")
    try:
        out = job["out"] or (os.path.join(tmp, "out") if job["reference"] else None)
        summary_path = os.path.join(tmp, "summary.json")
        cmd = [sys.executable, "-m", "flashrt_ros.tools.replay", job["bag"], *job["options"], "--json", summary_path]
        rc, err = _run(cmd + (["--output", out] if out else []), running)
        row["exit_code"] = rc
        if os.path.isfile(summary_path):
            s = json.loads(Path(summary_path).read_text())
            row.update(steps=s["steps"], messages=s["messages"], checks=s["rollback_checks"],
                       actions_sha256=s["actions_sha256"])
        if rc not in (0, 1):
            row["error"] = err
        elif job["reference"]:
            _compare(row, out, job["reference"], running)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    row["wall_s"] = round(time.monotonic() - t0, 3)
    return row


def _communicate(cmd: list[str], running: Workers | None) -> tuple[int, str, str]:
    """Run one worker process to its end: (exit code, stdout, stderr)."""
    running = running or Workers()  # a Ray task: its own registry (Ray cancels the task as a whole)
    proc = running.start(cmd)
    try:
        out, err = proc.communicate()
    finally:
        running.done(proc)
    return proc.returncode, out, err


def _run(cmd: list[str], running: Workers | None) -> tuple[int, str | None]:
    """(exit code, last stderr line)."""
    rc, _, err = _communicate(cmd, running)
    lines = [x for x in err.splitlines() if x.strip() and not x.startswith("[")]  # [hh:mm:ss] lines: progress
    return rc, (lines[-1] if lines else None)


def _compare(row: dict, out: str, reference: str, running: Workers | None) -> None:
    if not os.path.exists(reference):
        row.update(exit_code=2, reference="missing", error=f"no reference bag {reference}")
        return
    rc, stdout, stderr = _communicate([sys.executable, "-m", "flashrt_ros.tools.replay", "diff", out, reference],
                                      running)
    if rc in (0, 1):
        rep = json.loads(stdout)
        row["reference"] = "identical" if rep["identical"] else "different"
        if not rep["identical"]:
            row["first_divergence"] = {"index": rep["first_diverging_index"], "step": rep["first_diverging_step"],
                                       "max_abs_action_diff": rep["max_abs_action_diff"]}
    else:
        row["error"] = (stderr.strip().splitlines() or [f"diff exited {rc}"])[-1]
    if row["exit_code"] == 0 and rc != 0:
        row["exit_code"] = rc  # 1: differs from the reference; 2: the reference is unreadable


# ---- engines ---------------------------------------------------------------------------------------------
def run_processes(jobs: list[dict], workers: int) -> list[dict]:
    """At most `workers` bags at once, each in its own process. SIGINT/SIGTERM stop every running one."""
    running = Workers()
    pool = cf.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="replay")
    futures = {pool.submit(replay_one, j, running): j for j in jobs}
    rows = []
    try:
        pending = set(futures)
        while pending:
            done, pending = cf.wait(pending, timeout=0.5, return_when=cf.FIRST_COMPLETED)
            STOP.check()
            for f in done:
                rows.append(f.result())
                progress(f"corpus: {len(rows)}/{len(jobs)} bags ({rows[-1]['bag']}: exit {rows[-1]['exit_code']})")
    except BaseException:
        pool.shutdown(wait=False, cancel_futures=True)
        running.stop_all()
        raise
    pool.shutdown(wait=True)
    return rows


def run_ray(jobs: list[dict], address: str, workers: int | None) -> list[dict]:
    """The same rows from Ray tasks: `auto` joins the cluster RAY_ADDRESS or `ray start` names, else starts a
    local one (with --jobs CPUs); any other value is a cluster address. Bags and OUT_DIR must be on a path
    every node sees (a shared file system), and flashrt_ros installed on every node."""
    try:
        import ray
    except ImportError:
        raise BagError(RAY_HINT) from None
    if address == "auto":
        try:
            ray.init(address="auto", log_to_driver=False)
        except ConnectionError:  # no cluster running: a local one, on this machine's CPUs
            ray.init(num_cpus=workers, include_dashboard=False, log_to_driver=False)
    else:
        ray.init(address=address, log_to_driver=False)
    try:
        task = ray.remote(num_cpus=1, max_retries=0)(replay_one)
        refs = {task.remote(j): j for j in jobs}
        rows, pending = [], list(refs)
        while pending:
            done, pending = ray.wait(pending, num_returns=1, timeout=0.5)
            STOP.check()
            for r in done:
                rows.append(ray.get(r))
                progress(f"corpus (ray): {len(rows)}/{len(jobs)} bags")
        return rows
    except (Interrupted, KeyboardInterrupt):
        for r in refs:
            ray.cancel(r, force=True)
        raise
    finally:
        ray.shutdown()


# ---- the command -----------------------------------------------------------------------------------------
def child_options(args) -> list[str]:
    """The per-bag flags, as each worker's flashrt-replay gets them (paths absolute: Ray runs elsewhere)."""
    opts = ["--storage", args.storage, "--rollback-every", str(args.rollback_every),
            "--rollback-depth", str(args.rollback_depth), "--start-offset", repr(args.start_offset),
            "--backend", args.backend, "--max-decompressed-mb", repr(args.max_decompressed_mb)]
    if args.topic:
        opts += ["--topics", args.topic]
    if args.config:
        opts += ["--config", str(Path(args.config).resolve())]
    return opts


def table(rows: list[dict]) -> str:
    def checks(r):
        c = r["checks"]
        return "-" if c is None else f"{c['passed']}/{c['run']}"

    def divergence(r):
        d = r["first_divergence"]
        if d is not None:
            return f"index {d['index']}" + (f" (step {d['step']})" if d["step"] is not None else "")
        return {"identical": "none", None: "-"}.get(r["reference"], r["reference"])
    head = ("bag", "steps", "checks", "first divergence", "exit")
    body = [(r["bag"], "-" if r["steps"] is None else str(r["steps"]), checks(r), divergence(r), str(r["exit_code"]))
            for r in rows]
    widths = [max(len(x[i]) for x in [head, *body]) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(x, widths)).rstrip() for x in [head, *body]]
    lines += [f"{r['bag']}: {r['error']}" for r in rows if r["error"]]
    return "\n".join(lines)


def corpus_main(args) -> int:
    """Exit 0 when every bag's exit code is 0, else 1; bad corpus input raises BagError (exit 2)."""
    bags = find_bags(args.bag)
    out_dir = Path(args.out).resolve() if args.out else None
    if out_dir is not None and out_dir.exists():
        raise BagError(f"--output {args.out}: already exists; give a new directory (one bag per bag name goes in it)")
    ref_dir = Path(args.reference).resolve() if args.reference else None
    if ref_dir is not None and not ref_dir.is_dir():
        raise BagError(f"--reference {args.reference}: no such directory (it holds the reference output bags, "
                       "one per bag name, as a corpus --output writes them)")
    if args.json:
        check_json_output(args.json)
    if args.ray:
        try:
            import ray  # noqa: F401 - up front: not after the output directory is made
        except ImportError:
            raise BagError(RAY_HINT) from None
    if out_dir is not None:
        out_dir.mkdir(parents=True)
    opts = child_options(args)
    jobs = [{"name": bag_name(b), "bag": str(b), "options": opts,
             "out": str(out_dir / bag_name(b)) if out_dir else None,
             "reference": str(ref_dir / bag_name(b)) if ref_dir else None} for b in bags]
    workers = args.jobs or 1
    progress(f"corpus: {len(jobs)} bags, " + (f"Ray ({args.ray})" if args.ray else f"{workers} worker processes"))
    load_before, t0 = list(os.getloadavg()), time.monotonic()
    rows = run_ray(jobs, args.ray, args.jobs) if args.ray else run_processes(jobs, workers)
    wall = time.monotonic() - t0
    rows.sort(key=lambda r: r["bag"])
    failed = [r["bag"] for r in rows if r["exit_code"] != 0]
    summary = {"corpus": args.bag, "bags": len(rows), "failed": failed,
               "engine": f"ray ({args.ray})" if args.ray else "processes", "workers": None if args.ray else workers,
               "wall_s": round(wall, 3), "bags_per_minute": round(60 * len(rows) / wall, 2) if wall > 0 else None,
               "load_average": {"before": load_before, "after": list(os.getloadavg())}, "rows": rows}
    text, tab = json.dumps(summary, indent=2), table(rows)
    if args.json:
        Path(args.json).write_text(text + "\n")
    if out_dir is not None:
        (out_dir / "summary.json").write_text(text + "\n")
        (out_dir / "summary.txt").write_text(tab + "\n")
    print(tab)
    print(f"{len(rows)} bags, {len(failed)} failed, {summary['bags_per_minute']} bags/min ({summary['engine']})",
          file=sys.stderr)
    return 1 if failed else 0
