#!/usr/bin/env python3
"""Move the flat flashrt_ros/runtime/ and flashrt_ros/tools/ into the layered layout (issue 16, item 3) and
rewrite every reference to the moved modules. Re-runnable: run it on a clean checkout at any point.

    python3 scripts/relayout.py            # git mv + rewrite + ruff's import sort + a check that imports resolve
    python3 scripts/relayout.py --check    # only say what it would move; exit 1 on an unmapped module

What it rewrites, in every tracked text file (docs/results/ logs excepted):
  - relative imports of the moved files (recomputed from the file's new package), and
    `from flashrt_ros.runtime import kernels as K` style module imports (split one per module);
  - dotted names `flashrt_ros.runtime.x[.attr]` anywhere: absolute imports, `python -m` strings,
    monkeypatch targets, console_scripts in setup.py;
  - paths `flashrt_ros/runtime/x.py` and `runtime/x.py`, `RT + "x.py"` in test/mutations.py, and the bare
    file name of a renamed module (`persist_format.py`) in prose;
  - `Path(__file__)...parents[N]` in a moved file (one level deeper: N + 1);
  - the README's Layout block and docs/design.md's layout section.

Idempotent: a second run finds nothing to move and changes nothing. A new flat module that MOVES does not
know stops the run with its name: add one line to MOVES (or STAYS) and run it again.

An old name that is now a package (runtime.model, runtime.persist, tools.bench, tools.demo, tools.replay,
tools.plots) is told apart by what follows it: `flashrt_ros.runtime.persist.writer` (a submodule of the
new package) is new and kept; `flashrt_ros.runtime.persist.CapsuleLog` is old and rewritten. The new
packages' __init__.py re-export nothing, so `from flashrt_ros.runtime.persist import X` is always old.
"""
from __future__ import annotations

import argparse
import ast
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "flashrt_ros"

# ---- THE MAPPING: old path -> new path, both under flashrt_ros/. One line per module. ----------------------
MOVES = {
    # runtime/model: the network as data (config, buffer table, op list, kernel specs + NumPy twins, the plan
    # the ops are written into, sequence forms, prefill, weights). Imports nothing above it.
    "runtime/config.py": "runtime/model/config.py",
    "runtime/buffers.py": "runtime/model/buffers.py",
    "runtime/kernel_spec.py": "runtime/model/kernel_spec.py",
    "runtime/kernels.py": "runtime/model/kernels.py",
    "runtime/sequence.py": "runtime/model/sequence.py",
    "runtime/model.py": "runtime/model/network.py",
    "runtime/plan.py": "runtime/model/plan.py",
    "runtime/policy.py": "runtime/model/policy.py",
    "runtime/prefill.py": "runtime/model/prefill.py",
    "runtime/weights.py": "runtime/model/weights.py",
    # runtime/engine: runs a plan (numpy / cuda backends, the CUDA launch table, NVRTC, the capture check)
    "runtime/backend.py": "runtime/engine/backend.py",
    "runtime/cuda_backend.py": "runtime/engine/cuda_backend.py",
    "runtime/cpu_backend.py": "runtime/engine/cpu_backend.py",
    "runtime/cpu_kernels.py": "runtime/engine/cpu_kernels.py",
    "runtime/cpu_program.py": "runtime/engine/cpu_program.py",
    "runtime/cpu_attention.py": "runtime/engine/cpu_attention.py",
    "runtime/private_dir.py": "runtime/state/private_dir.py",
    "runtime/launch.py": "runtime/engine/launch_table.py",
    "runtime/nvrtc.py": "runtime/engine/nvrtc.py",
    "runtime/capture_check.py": "runtime/engine/capture_check.py",
    # runtime/state: the KV log, the capsule store, capsule files, sizing, bounds, history, step undo
    "runtime/kv_log.py": "runtime/state/kv_log.py",
    "runtime/capsule.py": "runtime/state/capsule_store.py",
    "runtime/capsule_file.py": "runtime/state/capsule_file.py",
    "runtime/sizing.py": "runtime/state/sizing.py",
    "runtime/history.py": "runtime/state/history.py",
    "runtime/state_bounds.py": "runtime/state/bounds.py",
    "runtime/step_undo.py": "runtime/state/step_undo.py",
    # runtime/persist: record format, writer thread, resume (reader), the Session glue
    "runtime/persist_format.py": "runtime/persist/format.py",
    "runtime/persist.py": "runtime/persist/writer.py",
    "runtime/resume.py": "runtime/persist/resume.py",
    "runtime/persistence.py": "runtime/persist/attach.py",
    # tools/bench: flashrt-bench
    "tools/bench.py": "tools/bench/cli.py",
    "tools/bench_capsules.py": "tools/bench/capsules.py",
    "tools/bench_gpu.py": "tools/bench/gpu.py",
    "tools/bench_measure.py": "tools/bench/measure.py",
    "tools/bench_persist.py": "tools/bench/persist.py",
    "tools/bench_replay.py": "tools/bench/replay.py",
    "tools/bench_ros.py": "tools/bench/ros.py",
    "tools/bench_runtime.py": "tools/bench/runtime.py",
    # tools/replay: flashrt-replay and the bag readers/writers
    "tools/replay.py": "tools/replay/cli.py",
    "tools/replay_live.py": "tools/replay/live.py",
    "tools/replay_stream.py": "tools/replay/stream.py",
    "tools/bags.py": "tools/replay/bags.py",
    "tools/mcap_limits.py": "tools/replay/mcap_limits.py",
    "tools/replay_corpus.py": "tools/replay/corpus.py",
    # tools/demo: flashrt-demo and its processes
    "tools/demo.py": "tools/demo/cli.py",
    "tools/demo_mission.py": "tools/demo/mission.py",
    "tools/demo_runtime.py": "tools/demo/runtime.py",
    "tools/planner.py": "tools/demo/planner.py",
    "tools/sensor_sim.py": "tools/demo/sensor_sim.py",
    # tools/plots: the --plot figures
    "tools/plots.py": "tools/plots/figures.py",
    "tools/plots_lineage.py": "tools/plots/lineage.py",
    "tools/plots_runs.py": "tools/plots/runs.py",
}
# Flat modules that stay where they are: the runtime facade, and what every tool shares.
STAYS = {
    "runtime/__init__.py", "runtime/session.py", "runtime/replan.py", "runtime/inputs.py", "runtime/errors.py",
    "tools/__init__.py", "tools/common.py", "tools/machine.py",
}
FLAT_DIRS = ("runtime", "tools")  # every *.py directly in these must be in MOVES or STAYS
NEW_PACKAGES = {
    "runtime/model": "The network as data: config, buffer table, op list, kernel specs and NumPy twins, the plan.",
    "runtime/engine": "Runs a plan: the numpy and cuda backends, the CUDA launch table, NVRTC, the capture check.",
    "runtime/state": "The state store: KV log, capsule store, capsule files, sizing, bounds, history, step undo.",
    "runtime/persist": "Crash-resume: the record format, the writer thread, resume, the Session glue (attach).",
    "tools/bench": "flashrt-bench.",
    "tools/replay": "flashrt-replay and the bag readers/writers.",
    "tools/demo": "flashrt-demo and the processes of its mission.",
    "tools/plots": "The --plot figures.",
}
MAINS = {"tools/bench": "flashrt-bench", "tools/demo": "flashrt-demo", "tools/replay": "flashrt-replay"}
TEXT_SUFFIXES = {".py", ".md", ".cfg", ".toml", ".txt", ".cu", ".cuh", ".sh", ".yaml", ".ini"}
SKIP = ("scripts/relayout.py", ".importlinter", "docs/results/")

README_LAYOUT = """\
flashrt_ros/runtime/   ROS-free; imports point down only (`make lint` runs import-linter):
  model/               config, buffers (buffer table + arena), network (the ops: a step and a sequence
                       form each), policy (buffer table + step plan from the ops), kernel_spec (one spec
                       per kernel, the constants CUDA gets as -D flags), kernels (NumPy twins), plan,
                       sequence (prefill forms), prefill (walks the ops), weights
  engine/              backend (numpy, select), cuda_backend, launch_table (CUDA launches), nvrtc,
                       capture_check (the capture discipline)
  state/               kv_log (paged log), capsule_store, capsule_file, sizing, bounds, history, step_undo
  persist/             format (segments, records), writer (thread), resume (reader), attach (Session glue)
  session.py replan.py inputs.py errors.py   the facade (`from flashrt_ros.runtime import Session`)
flashrt_ros/ros/       the rclpy adapter: node (lifecycle), params, services, capsule_dir, replan_server,
                       convert, diagnostics, client, step_link (policy_step QoS and the client handshake)
flashrt_ros/tools/     bench/ (flashrt-bench), replay/ (flashrt-replay, bags), demo/ (flashrt-demo,
                       planner, sensor_sim), plots/ (--plot figures); common.py, machine.py shared
docs/design.md         the log-structured capsule store, paged attention, eviction and pins
flashrt_interfaces/    ament_cmake: msg/ srv/ action/
kernels/               CUDA C: dense.cu recurrent.cu attention.cu head.cu ssm.cu + common.cuh
test/                  pytest; test/cuda_on_cpu runs the same .cu on the CPU (g++ + a shim header)
"""
# What the rewrite cannot see, patched by exact text after it: (file, text after the rewrite, replacement).
# Applied only where the text is there. Lines made longer than ruff's 120 (a new one makes the run stop,
# naming it), a path taken relative to a moved module's __file__, a module name built in an f-string.
FIXUPS = [
    ("test/test_kernel_specs.py", "root = Path(K.__file__).resolve().parents[1]\n",
     "root = Path(K.__file__).resolve().parents[2]  # flashrt_ros/\n"),
    ("test/test_plots.py", "from flashrt_ros.tools.{module} import main",
     "from flashrt_ros.tools.{module}.cli import main"),
    ("test/test_replay_live.py",
     'EVERY_MESSAGE = ("import sys; from flashrt_ros.tools.replay import cli as replay, live as replay_live; '
     'replay_live.PROGRESS_EVERY = 1; "\n',
     'EVERY_MESSAGE = ("import sys; from flashrt_ros.tools.replay import cli as replay, live as replay_live; "\n'
     '                 "replay_live.PROGRESS_EVERY = 1; "\n'),
    ("test/test_ros_replan.py",
     '"-m", "flashrt_ros.tools.demo.planner", "--duration", "1.2", "--period", "0.3",\n'
     '                          "--namespace",',
     '"-m", "flashrt_ros.tools.demo.planner", "--duration", "1.2",\n'
     '                          "--period", "0.3", "--namespace",'),
]
DESIGN_HEADING = "## Code layout and layer order"
DESIGN_SECTION = DESIGN_HEADING + """

`flashrt_ros/runtime/` is five layers; a module imports only from its own layer or the ones below it,
and `make lint` (import-linter, contracts in `.importlinter`) fails on a wrong-way import:

| layer | holds | may import |
|---|---|---|
| facade: `session.py` > `replan.py` > `inputs.py` | step, rollback, replan, cold baseline | everything below |
| `persist/` | `format` (records), `writer` (thread), `resume` (reader), `attach` (Session glue) | state, model |
| `engine/` (independent of state) | backends, CUDA launch table, NVRTC, capture check | model |
| `state/` (independent of engine) | KV log, capsule store and files, sizing, bounds, history | model |
| `model/` | config, buffer table, ops, kernel specs and twins, plan, sequence forms, weights | errors |
| `errors.py` | the exceptions | nothing |

The plan (`model/plan.py`) is what the ops are written into, so it sits with them; the engine binds and
runs it. `runtime` imports neither `ros` nor `tools`; `ros` never imports `tools`. Within `tools/`:
bench > replay > demo > plots > (common, machine). The move itself is `scripts/relayout.py`.

"""


def dotted(rel: str) -> str:
    """runtime/model/config.py -> flashrt_ros.runtime.model.config"""
    rel = rel[:-3] if rel.endswith(".py") else rel
    rel = rel[:-len("/__init__")] if rel.endswith("/__init__") else rel
    return "flashrt_ros." + rel.replace("/", ".")


OLD2NEW = {dotted(o): dotted(n) for o, n in MOVES.items()}
CLI_PACKAGES = {dotted(p) for p in MAINS}  # old module, now a package whose __main__ runs its cli
COLLIDE = {o for o in OLD2NEW if any(n.startswith(o + ".") for n in OLD2NEW.values())}  # old module, now a package
BARE = {Path(o).name: n.split("/", 1)[1] for o, n in MOVES.items() if Path(o).name != Path(n).name}


def fail(msg: str) -> None:
    print(f"relayout: {msg}", file=sys.stderr)
    sys.exit(1)


def module_exists(name: str) -> bool:
    parts = name.split(".")
    if parts[0] != "flashrt_ros":
        return True  # not ours
    p = ROOT.joinpath(*parts)
    return p.with_suffix(".py").is_file() or (p / "__init__.py").is_file()


def is_submodule(package: str, name: str) -> bool:
    p = ROOT.joinpath(*package.split("."))
    return (p / "__init__.py").is_file() and ((p / f"{name}.py").is_file() or (p / name / "__init__.py").is_file())


# ---- 1. what moves -------------------------------------------------------------------------------------------
def unmapped() -> list[str]:
    known = set(MOVES) | STAYS
    return sorted(f"flashrt_ros/{d}/{p.name}" for d in FLAT_DIRS for p in (PKG / d).glob("*.py")
                  if f"{d}/{p.name}" not in known)


def plan_moves() -> dict[str, str]:
    todo = {}
    for old, new in MOVES.items():
        if (PKG / old).exists():
            if (PKG / new).exists():
                fail(f"flashrt_ros/{old} and flashrt_ros/{new} both exist: merge them by hand, then run again")
            todo[old] = new
        elif not (PKG / new).exists():
            fail(f"flashrt_ros/{old} is in MOVES but neither it nor flashrt_ros/{new} exists: fix the table")
    return todo


def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, check=True, capture_output=True, text=True).stdout


def make_packages() -> list[Path]:
    made = []
    for pkg, doc in NEW_PACKAGES.items():
        d = PKG / pkg
        d.mkdir(parents=True, exist_ok=True)
        init = d / "__init__.py"
        if not init.exists():
            init.write_text(f'"""{doc}\n\nRe-exports nothing: import from the module itself."""\n')
            made.append(init)
    for pkg, command in MAINS.items():
        main = PKG / pkg / "__main__.py"
        if not main.exists():
            main.write_text(f'"""`python -m` on this package: the same as `{command}`."""\nimport sys\n\n'
                            f"from .cli import main\n\nsys.exit(main())\n")
            made.append(main)
    return made


# ---- 2. rewriting ----------------------------------------------------------------------------------------------
def map_module(name: str, rest: str = "") -> str:
    """The new dotted name of module `name`; `rest` is the identifier after it (`flashrt_ros.runtime.persist.X`)."""
    if name not in OLD2NEW:
        return name
    if name in COLLIDE and rest and is_submodule(name, rest):
        return name  # already the new package
    return OLD2NEW[name]


def relative(target: str, package: str) -> str:
    t, p = target.split("."), package.split(".")
    common = 0
    while common < min(len(t), len(p)) and t[common] == p[common]:
        common += 1
    return "." * (len(p) - common + 1) + ".".join(t[common:])


def resolve(dots: str, mod: str, package: str) -> str:
    base = package.split(".")
    base = base[:len(base) - (len(dots) - 1)]
    return ".".join(base + ([mod] if mod else []))


FROM_RE = re.compile(r"(?P<lead>^[ \t]*)?\bfrom (?P<mod>\.+[\w.]*|flashrt_ros(?:\.\w+)*) import "
                     r"(?P<names>\(|[\w ,]+?)(?=\s*(?:;|$|\\n|\"|'|\)|#))", re.M)


def rewrite_from(m: re.Match, package: str, old_package: str | None) -> str:
    mod, names_text, lead = m.group("mod"), m.group("names"), m.group("lead")
    rel = mod.startswith(".")
    names = [] if names_text == "(" else [n.strip() for n in names_text.split(",") if n.strip()]
    pairs = [(n.split(" as ")[0].strip(), n.split(" as ")[1].strip() if " as " in n else None) for n in names]
    if rel:
        absolute = resolve(re.match(r"\.+", mod).group(), mod.lstrip("."), package)
        if old_package and not module_exists(absolute):  # a file written before its move (a merged branch)
            absolute = resolve(re.match(r"\.+", mod).group(), mod.lstrip("."), old_package)
    else:
        absolute = mod
    first = pairs[0][0] if pairs else ""
    if absolute in COLLIDE and pairs and all(is_submodule(absolute, n) for n, _ in pairs):
        new_mod = absolute  # `from ..persist import writer`: the new package
    else:
        new_mod = map_module(absolute, first if absolute in COLLIDE and len(pairs) == 1 else "")
    keep, split = [], []
    for name, alias in pairs:
        full = f"{new_mod}.{name}"
        if full in OLD2NEW and OLD2NEW[full] != full:
            parent, leaf = OLD2NEW[full].rsplit(".", 1)
            split.append((parent, leaf, alias or name))
        else:
            keep.append(name + (f" as {alias}" if alias else ""))

    def spell(module: str) -> str:
        return relative(module, package) if rel else module

    statements = []
    if keep or names_text == "(":
        tail = "(" if names_text == "(" else ", ".join(keep)
        statements.append(f"from {spell(new_mod)} import {tail}")
    by_parent: dict[str, list[str]] = {}
    for parent, leaf, alias in split:
        by_parent.setdefault(parent, []).append(leaf + (f" as {alias}" if alias != leaf else ""))
    for parent, leaves in by_parent.items():
        statements.append(f"from {spell(parent)} import {', '.join(leaves)}")
    if not split and spell(new_mod) == mod:
        return m.group(0)
    code_line = lead is not None
    joiner = ("\n" + lead) if code_line else "; "
    return (lead or "") + joiner.join(statements)


DOTTED_RE = re.compile(r"(?<![\w.])flashrt_ros\.(?:runtime|tools)\.\w+(?!\w)")
PATH_RE = re.compile(r"(?<![\w.-])(flashrt_ros/)?(runtime|tools)/(\w+)\.py(?!\w)")
RT_RE = re.compile(r'\bRT \+ "(\w+)\.py"')
BARE_RE = re.compile(r"(?<![\w./-])(" + "|".join(map(re.escape, (b[:-3] for b in BARE))) + r")\.py(?!\w)")
PARENTS_RE = re.compile(r"(\bparents\[)(\d+)(\])")


def rewrite_dotted(m: re.Match) -> str:
    s, end = m.string, m.end()
    if s[max(0, m.start() - 5):m.start()] == "from ":
        return m.group(0)  # a from-import: FROM_RE has mapped it already
    nxt = re.match(r"\.(\w+)", s[end:])
    if not nxt and m.group(0) in CLI_PACKAGES and not s[end:end + 1] == ":":
        return m.group(0)  # `python -m flashrt_ros.tools.bench`: the package's __main__ runs the CLI
    return map_module(m.group(0), nxt.group(1) if nxt else "")


def rewrite_text(text: str, path: str, package: str | None, old_package: str | None, moved_now: bool) -> str:
    text = FROM_RE.sub(lambda m: rewrite_from(m, package or "", old_package)
                       if (package or not m.group("mod").startswith(".")) else m.group(0), text)
    if path.endswith(".py"):
        if moved_now:
            text = "\n".join(PARENTS_RE.sub(lambda m: f"{m.group(1)}{int(m.group(2)) + 1}{m.group(3)}", line)
                             if "__file__" in line or "here.parents" in line else line for line in text.split("\n"))
    text = DOTTED_RE.sub(rewrite_dotted, text)
    text = PATH_RE.sub(lambda m: (m.group(1) or "") + MOVES.get(f"{m.group(2)}/{m.group(3)}.py",
                                                                  f"{m.group(2)}/{m.group(3)}.py"), text)
    text = RT_RE.sub(lambda m: f'RT + "{MOVES.get(f"runtime/{m.group(1)}.py", "runtime/" + m.group(1) + ".py")[8:]}"',
                     text)
    text = BARE_RE.sub(lambda m: BARE[m.group(1) + ".py"], text)
    return text


def package_of(rel: str) -> str | None:
    """flashrt_ros/runtime/persist/writer.py -> flashrt_ros.runtime.persist (None outside the package)."""
    if not rel.startswith("flashrt_ros/"):
        return None
    inside = Path(rel).parent.relative_to("flashrt_ros")
    return "flashrt_ros" if str(inside) == "." else dotted(str(inside))


def write_docs() -> None:
    readme = ROOT / "README.md"
    t = readme.read_text()
    m = re.search(r"^## Layout\n\n```\n(.*?)^```", t, re.M | re.S)
    if not m:
        fail("README.md: no '## Layout' block (a ``` block right under the heading) to rewrite")
    readme.write_text(t[:m.start(1)] + README_LAYOUT + t[m.end(1):])
    design = ROOT / "docs" / "design.md"
    d = design.read_text()
    if DESIGN_HEADING not in d:
        first = re.search(r"^## ", d, re.M)
        design.write_text(d[:first.start()] + DESIGN_SECTION + d[first.start():])


# ---- 3. the check: every flashrt_ros import resolves ----------------------------------------------------------
def unresolved(files: list[str]) -> list[str]:
    bad = []
    for rel in files:
        if not rel.endswith(".py"):
            continue
        try:
            tree = ast.parse((ROOT / rel).read_text())
        except SyntaxError as e:
            bad.append(f"{rel}: does not parse after the rewrite: {e}")
            continue
        package = package_of(rel)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    if package is None:
                        continue
                    mod = resolve("." * node.level, node.module or "", package)
                else:
                    mod = node.module or ""
                if not mod.startswith("flashrt_ros"):
                    continue
                if not module_exists(mod):
                    bad.append(f"{rel}:{node.lineno}: no module {mod}")
                    continue
                for a in node.names:
                    if f"{mod}.{a.name}" in OLD2NEW and OLD2NEW[f"{mod}.{a.name}"] != f"{mod}.{a.name}":
                        bad.append(f"{rel}:{node.lineno}: {mod}.{a.name} moved (to {OLD2NEW[f'{mod}.{a.name}']})")
            elif isinstance(node, ast.Import):
                for a in node.names:
                    if a.name.startswith("flashrt_ros") and not module_exists(a.name):
                        bad.append(f"{rel}:{node.lineno}: no module {a.name}")
    return bad


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="only report what would move; exit 1 on an unmapped module")
    args = ap.parse_args(argv)
    missing = unmapped()
    if missing:
        fail("no mapping for " + ", ".join(missing) + ": add a line for each to MOVES (or STAYS) at the top of "
             "scripts/relayout.py, then run it again")
    todo = plan_moves()
    if args.check:
        for old, new in todo.items():
            print(f"flashrt_ros/{old} -> flashrt_ros/{new}")
        print(f"relayout: {len(todo)} to move" if todo else "relayout: already in the new layout")
        return 0
    if git("status", "--porcelain", "--untracked-files=no").strip():
        fail("the working tree has uncommitted changes: commit or stash them first (the run is a git mv + rewrite)")
    made = make_packages()
    for old, new in todo.items():
        git("mv", f"flashrt_ros/{old}", f"flashrt_ros/{new}")
    if made:
        git("add", *[str(p.relative_to(ROOT)) for p in made])
    moved_from = {f"flashrt_ros/{n}": f"flashrt_ros/{o}" for o, n in todo.items()}
    files = [f for f in git("ls-files").split("\n") if f and not f.startswith(SKIP)
             and (Path(f).suffix in TEXT_SUFFIXES or Path(f).name == "Makefile") and (ROOT / f).is_file()]
    changed = []
    for rel in files:
        text = (ROOT / rel).read_text()
        moved_now = rel in moved_from
        package = package_of(moved_from[rel]) if moved_now else package_of(rel)
        # a file at its new place that a merged branch edited may still spell its old neighbours
        old_rel = next((o for o, n in MOVES.items() if "flashrt_ros/" + n == rel), None)
        old_package = package_of("flashrt_ros/" + old_rel) if old_rel and not moved_now else None
        new = rewrite_text(text, rel, package, old_package, moved_now)
        if moved_now:  # its relative imports, recomputed from where it now lives
            here = package_of(rel)
            new = FROM_RE.sub(lambda m, old=package, here=here: rerelativize(m, old, here), new)
        if new != text:
            (ROOT / rel).write_text(new)
            changed.append(rel)
    for rel, before, after in FIXUPS:
        f = ROOT / rel
        if f.is_file() and before in f.read_text():
            f.write_text(f.read_text().replace(before, after))
    write_docs()
    bad = unresolved(files)
    if bad:
        fail("imports that do not resolve after the rewrite (fix by hand or add to MOVES):\n  " + "\n  ".join(bad))
    ruff = shutil.which("ruff", path=str(ROOT / ".venv" / "bin")) or shutil.which("ruff")
    py = [f for f in changed if f.endswith(".py")]
    if ruff and py:  # the rewritten import lines, sorted as ruff's isort wants them; then the whole of ruff
        subprocess.run([ruff, "check", "-q", "--select", "I", "--fix", *py], cwd=ROOT, check=False)
        if subprocess.run([ruff, "check", "-q", *py], cwd=ROOT).returncode:
            fail("ruff finds the problems above in rewritten files (a line made too long?): wrap them by hand, "
                 "or add a FIXUPS entry and run again on a clean checkout")
    elif py:
        print("relayout: ruff not found: run `ruff check --select I --fix` on the changed files", file=sys.stderr)
    print(f"relayout: moved {len(todo)} modules, rewrote {len(changed)} files" if todo or changed
          else "relayout: already in the new layout; nothing changed")
    return 0


def rerelativize(m: re.Match, old_package: str, new_package: str) -> str:
    """A relative import written for old_package, respelled for new_package (same target)."""
    mod = m.group("mod")
    if not mod.startswith("."):
        return m.group(0)
    target = resolve(re.match(r"\.+", mod).group(), mod.lstrip("."), old_package)
    new = relative(target, new_package)
    return m.group(0).replace(f"from {mod} import", f"from {new} import", 1)


if __name__ == "__main__":
    sys.exit(main())
