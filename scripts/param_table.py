#!/usr/bin/env python3
"""The parameter table of docs/ros.md, made from what the node declares: ros/params.py (NODE_PARAMS,
NODE_RANGES) and PolicyConfig's fields (their help, min and choices). test_ros_params.py checks the page holds
exactly this. The table lives between its markers on one page of README.md and docs/*.md.

    python scripts/param_table.py          # print it
    python scripts/param_table.py --write  # put it into its page, between its markers
    python scripts/param_table.py --check  # exit 1 when the page's table is out of date
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BEGIN, END = "<!-- parameter table: scripts/param_table.py -->", "<!-- end of parameter table -->"


def _default(name: str, value) -> str:
    if name == "capsule_dir":
        return "`$ROS_HOME/flashrt_capsules`"  # resolved per machine; the description says how
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if value == "":
        return '`""`'
    return f"`{_num(value)}`" if isinstance(value, float) else f"`{value}`"


def _num(x) -> str:
    return str(int(x)) if float(x).is_integer() else repr(x)  # 3600000, not 3.6e+06; 0.001 as it is


def _range(lo, hi) -> str:
    return f"{_num(lo)} .. {_num(hi)}"


def rows() -> list[tuple[str, str, str, str, str]]:
    """(name, default, range or choices, when it can be set, description), the node's own first."""
    sys.path.insert(0, str(ROOT))
    from flashrt_ros.ros.params import NODE_PARAMS, NODE_RANGES
    from flashrt_ros.runtime import PolicyConfig
    out = []
    for name, (default, description, _validate, live) in NODE_PARAMS.items():
        rng = _range(*NODE_RANGES[name]) if name in NODE_RANGES else ""
        out.append((name, _default(name, default), rng, "running" if live else "start-up", description))
    for f in dataclasses.fields(PolicyConfig):
        lo, hi, choices = f.metadata.get("min"), f.metadata.get("max"), f.metadata.get("choices")
        if choices:
            rng = " \\| ".join(choices)
        elif lo is not None:
            rng = _range(lo, hi) if hi is not None else f">= {_num(lo)}"
        else:
            rng = ""
        out.append((f.name, _default(f.name, f.default), rng, "start-up", f.metadata["help"]))
    return out


def table() -> str:
    lines = [BEGIN, "", "| parameter | default | range | set at | what it does |", "|---|---|---|---|---|"]
    for name, default, rng, when, description in rows():
        lines.append(f"| `{name}` | {default} | {rng} | {when} | {description.replace('|', chr(92) + '|')} |")
    return "\n".join(lines + ["", END])


def table_page() -> Path:
    """The one page of README.md and docs/*.md that holds the table's markers."""
    pages = [p for p in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))] if BEGIN in p.read_text()]
    if len(pages) != 1:
        raise SystemExit(f"one page of README.md and docs/*.md must hold {BEGIN!r}; found {len(pages)}: {pages}")
    return pages[0]


def readme_with_table(text: str) -> str:
    if text.count(BEGIN) != 1 or text.count(END) != 1:
        raise SystemExit(f"the table's page must hold one {BEGIN!r} and one {END!r}")
    head, rest = text.split(BEGIN)
    _, tail = rest.split(END)
    return head + table() + tail


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--write", action="store_true", help="rewrite the table in its page")
    mode.add_argument("--check", action="store_true", help="exit 1 when the page's table is out of date")
    args = ap.parse_args(argv)
    if args.write or args.check:
        page = table_page()
        text = page.read_text()
        if args.check:
            if readme_with_table(text) != text:
                print(f"{page.relative_to(ROOT)}: the parameter table is out of date: run {__file__} --write",
                      file=sys.stderr)
                return 1
            return 0
        page.write_text(readme_with_table(text))
    else:
        print(table())
    return 0


if __name__ == "__main__":
    sys.exit(main())
