"""Every relative link and image of the README and docs/*.md reaches a file that exists, and every #anchor a
heading of that file (GitHub's slugs): moving a section between pages must carry its links along."""
import re

import pytest
from doc_pages import NOT_USER_PAGES, PAGES, ROOT

LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation other than - and _ dropped, spaces to -."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(text: str) -> set[str]:
    prose = re.sub(r"^ *```.*?^ *```", "", text, flags=re.M | re.S)
    return {slug(m[1]) for m in re.finditer(r"^#+ (.+)$", prose, re.M)}


def links(page: str) -> list[str]:
    prose = re.sub(r"^ *```.*?^ *```", "", (ROOT / page).read_text(), flags=re.M | re.S)
    return [target for target in LINK.findall(prose) if not re.match(r"[a-z]+:", target)]


def test_slug_is_githubs():
    assert slug("Replicas and failover (`role`, `~/capsule_stream`)") == "replicas-and-failover-role-capsule_stream"
    assert slug("GPU: re-plan vs recompute (H200)") == "gpu-re-plan-vs-recompute-h200"


@pytest.mark.parametrize("page", PAGES + NOT_USER_PAGES)
def test_every_relative_link_reaches_a_file_and_a_heading(page):
    here = (ROOT / page).parent
    checked = 0
    for target in links(page):
        path, _, anchor = target.partition("#")
        file = (here / path).resolve() if path else ROOT / page
        assert file.exists(), f"{page}: {target} names no file"
        if anchor:
            assert anchor in anchors(file.read_text()), f"{page}: {target}: no such heading in {file.name}"
        checked += 1
    if page == "README.md":
        assert checked >= 10  # the docs index and the links into it
