"""The Results numbers (docs/results.md, moved there from the README), the README's headline numbers and
docs/readme_numbers.json (what `make reproduce` compares against) say the same thing, every table row is
covered, and the reproduce script's lookup and comparison work on bench-shaped JSON."""
import importlib.util
import json
import re
import subprocess
import sys

import pytest
from doc_pages import ROOT, texts

PAGES = {page: text.splitlines() for page, text in texts().items()}
SPEC = json.loads((ROOT / "docs" / "readme_numbers.json").read_text())
_spec = importlib.util.spec_from_file_location("reproduce", ROOT / "scripts" / "reproduce.py")
reproduce = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(reproduce)


def section(heading: str) -> list[str]:
    """The lines from `heading` to the next heading of the same or a higher level, on the one page that has it."""
    starts = [(page, i) for page, lines in PAGES.items() for i, line in enumerate(lines)
              if line.strip() == heading or line.startswith(heading + " ")]
    assert len(starts) == 1, f"heading {heading!r} found {len(starts)} times in the pages: {starts}"
    (page, start), = starts
    level = len(heading) - len(heading.lstrip("#"))
    out = []
    for line in PAGES[page][start + 1:]:
        if re.match(rf"^#{{1,{level}}} ", line):
            break
        out.append(line)
    return out


def table_rows(lines: list[str]) -> list[str]:
    """Data rows of the markdown tables in lines (not the header, not the |---| rule)."""
    rows = []
    for i, line in enumerate(lines):
        if not line.startswith("|") or re.match(r"^\|[-| ]+\|$", line):
            continue
        if i + 1 < len(lines) and re.match(r"^\|[-| ]+\|$", lines[i + 1]):
            continue  # a header
        rows.append(line)
    return rows


def first_number(text: str) -> float:
    m = re.search(r"(?<![\w.])-?\d[\d,]*(?:\.\d+)?", text)  # not the 50 of p50
    assert m, f"no number in {text!r}"
    return float(m[0].replace(",", ""))


@pytest.mark.parametrize("n", SPEC["numbers"], ids=lambda n: f"{n['table']}:{n['id']}")
def test_each_number_is_printed_in_its_readme_row_as_the_numbers_file_says(n):
    lines = [line for line in section(SPEC["tables"][n["table"]]["heading"]) if n["row"] in line]
    assert len(lines) == 1, f"row {n['row']!r}: {len(lines)} matching lines under its heading"
    assert n["text"] in lines[0], f"{n['id']}: the page says {lines[0]!r}, the numbers file {n['text']!r}"
    assert first_number(n["text"]) == n["value"], n["id"]


def test_every_results_table_row_is_rerun_or_says_why_not():
    for name, table in SPEC["tables"].items():
        rows = table_rows(section(table["heading"]))
        covered = [x["row"] for x in SPEC["numbers"] + SPEC["not_rerun"] if x["table"] == name]
        for row in rows:
            assert any(c in row for c in covered), f"{name}: a row not in docs/readme_numbers.json: {row}"


def test_the_numbers_file_names_every_results_table_and_each_table_a_bench_the_script_runs():
    results = section("## Results")
    headings = [t["heading"] for t in SPEC["tables"].values()]
    for line in results:
        if line.startswith("### ") and table_rows(section(line.strip())):
            assert any(line == h or line.startswith(h + " ") for h in headings), f"reproduce does not know {line}"
    assert {t["bench"] for t in SPEC["tables"].values()} <= set(reproduce.bench_commands(60.0))
    assert len({(n["table"], n["id"]) for n in SPEC["numbers"]}) == len(SPEC["numbers"]), "duplicate ids"


def test_each_headline_number_is_a_results_number_as_printed_with_its_machine_and_day():
    numbers = {f"{n['table']}:{n['id']}": n for n in SPEC["numbers"]}
    rows = table_rows(section(SPEC["headline"]["heading"]))
    assert rows, "the README's headline table is gone"
    for row in rows:
        assert any(h["row"] in row for h in SPEC["headline"]["rows"]), f"a headline row the numbers file lacks: {row}"
    for h in SPEC["headline"]["rows"]:
        lines = [row for row in rows if h["row"] in row]
        assert len(lines) == 1, f"row {h['row']!r}: {len(lines)} matching rows in the README's headline table"
        line = lines[0]
        for ref in h["numbers"]:
            n = numbers[ref["number"]]
            assert ref["text"] in line, f"{ref['number']}: the README row says {line!r}, not {ref['text']!r}"
            assert first_number(ref["text"]) == n["value"], f"{ref['number']}: {ref['text']!r} is not {n['value']}"
            machine = SPEC["tables"][n["table"]]["machine"]
            name, day = re.split(r"[(,]", machine)[0].strip(), re.search(r"\d{4}-\d\d-\d\d", machine)[0]
            assert name in line and day in line, f"{ref['number']} ran on {machine!r}; the row says {line!r}"


def test_lookup_follows_dotted_paths_and_list_selectors():
    data = {"histories": [{"history": 2048, "ms": 1.5}, {"history": 4096, "ms": 3.0}],
            "replan_ms": {"4x8@1024": {"p50": 11.0}}}
    assert reproduce.lookup(data, "histories[history=4096].ms") == 3.0
    assert reproduce.lookup(data, "replan_ms.4x8@1024.p50") == 11.0
    assert reproduce.lookup(data, "histories[history=8192].ms") is None
    assert reproduce.lookup(data, "replan_ms.8x8@1024.p50") is None


def test_compare_gives_readme_fresh_and_ratio_and_marks_missing_and_skipped():
    spec = {"tables": {"t": {"heading": "### T", "bench": "runtime", "conditions": "c"}},
            "numbers": [{"table": "t", "id": "a", "row": "|", "text": "2", "value": 2.0, "path": "x.y"},
                        {"table": "t", "id": "pct", "row": "|", "text": "1.0 %", "value": 1.0, "path": "o",
                         "scale": 100},
                        {"table": "t", "id": "gone", "row": "|", "text": "1", "value": 1.0, "path": "nope"}]}
    res = reproduce.compare(spec, "t", {"x": {"y": 3.0}, "o": 0.02})
    by = {r["id"]: r for r in res["rows"]}
    assert (by["a"]["fresh"], by["a"]["ratio"]) == (3.0, 1.5)
    assert (by["pct"]["fresh"], by["pct"]["ratio"]) == (2.0, 2.0)
    assert by["gone"]["fresh"] is None and by["gone"]["ratio"] is None
    printed = reproduce.format_table(res)
    assert "missing" in printed and "1.50" in printed
    skipped = reproduce.compare(spec, "t", None, "no usable CUDA device (none)")
    assert "skipped: no usable CUDA device" in reproduce.format_table(skipped)
    assert all(r["fresh"] is None for r in skipped["rows"])


def test_reproduce_lists_its_plan_and_refuses_an_unknown_table():
    res = subprocess.run([sys.executable, str(ROOT / "scripts" / "reproduce.py"), "--list"], capture_output=True,
                         text=True, timeout=60, cwd=ROOT)
    assert res.returncode == 0, res.stderr
    assert {line.split(":")[0] for line in res.stdout.splitlines()} == {t["bench"] for t in SPEC["tables"].values()}
    bad = subprocess.run([sys.executable, str(ROOT / "scripts" / "reproduce.py"), "--tables", "nope"],
                         capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert bad.returncode == 2 and "unknown table(s) nope" in bad.stderr
