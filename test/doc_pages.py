"""The pages a user reads: README.md and the docs/ pages its sections moved to (issue 45). The README tests,
the parameter table and the number checks read all of them, in this order, so a block that moves between
them stays checked, and one that leaves them all fails the test that looked for it."""
from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

PAGES = ("README.md", "docs/ros.md", "docs/operations.md", "docs/replay.md", "docs/results.md", "docs/testing.md",
         "docs/limits.md", "docs/install.md", "docs/sim.md", "docs/leadership.md")
JOURNAL = tuple(sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs" / "journal").glob("*.md")))
# The developers' record and the reference pages: their names of tools that never shipped, or of one-off
# probes, are history, not commands. policy.md's weight table has its own test (test_policy_file.py).
NOT_USER_PAGES = ("docs/design.md", "docs/notes.md", "docs/policy.md", "docs/training.md", *JOURNAL)


def texts() -> dict[str, str]:
    """Each page's text by its path from the repository root, in reading order."""
    return {page: (ROOT / page).read_text() for page in PAGES}


def joined() -> str:
    """All pages as one text, for searches that do not care where a thing is (each page closes its fences)."""
    return "\n\n".join(texts().values())
