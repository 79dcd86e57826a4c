"""The README's examples run as written, wherever they now live (doc_pages.PAGES: the README and the docs/
pages its sections moved to): every ```python block, and every `make` target the pages name."""
import re
import subprocess
import sys

import pytest
from doc_pages import NOT_USER_PAGES, PAGES, ROOT, joined, texts

PYTHON_BLOCKS = [(page, block) for page, text in texts().items()
                 for block in re.findall(r"^```python\n(.*?)^```", text, re.M | re.S)]
DOCS = joined()


def test_the_readme_itself_has_python_examples():
    assert any(page == "README.md" for page, _ in PYTHON_BLOCKS)


@pytest.mark.parametrize("index", range(len(PYTHON_BLOCKS)))
def test_readme_python_block_runs_as_written(index, tmp_path):
    # A fresh interpreter in an empty directory: only what the block itself imports and defines.
    page, block = PYTHON_BLOCKS[index]
    res = subprocess.run([sys.executable, "-c", block], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, f"{page}, block {index}:\n{block}\n{res.stderr[-3000:]}"


def test_every_make_target_the_pages_name_exists():
    targets = set(re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(), re.M))
    named = set(re.findall(r"`make ([\w-]+)", DOCS)) | set(re.findall(r"^make ([\w-]+)", DOCS, re.M))
    assert {"demo", "test", "test-compat", "test-jazzy"} <= named
    assert named <= targets, named - targets


def test_the_two_commands_open_the_readme():
    readme = (ROOT / "README.md").read_text()
    first_block = re.search(r"^```bash\n(.*?)^```", readme, re.M | re.S)[1]
    assert [line.split("#")[0].strip() for line in first_block.splitlines()] == ["make demo", "make test"]
    assert readme.index("## Two commands") < readme.index("## A capsule in a few lines")


def test_the_readme_stays_a_short_page():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 350  # issue 45: the rest lives in docs/


def test_every_docs_page_is_a_checked_page_or_a_record():
    pages = {str(p.relative_to(ROOT)) for p in (ROOT / "docs").rglob("*.md")}
    assert pages == set(PAGES[1:]) | set(NOT_USER_PAGES), "a new page under docs/: add it to doc_pages.PAGES"
