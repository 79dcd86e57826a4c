"""The tools leave the checkout as it was and say what they do (issue 44, item 10): `make plots` draws into
out/ (untracked), so it never rewrites the README's tracked figures in docs/img/ unless asked."""
from __future__ import annotations

import subprocess

from conftest import ROOT


def test_make_plots_draws_into_out_and_docs_img_only_when_asked():
    dry = subprocess.run(["make", "-n", "plots"], cwd=ROOT, capture_output=True, text=True)
    assert dry.returncode == 0, dry.stderr
    line = next(x for x in dry.stdout.splitlines() if "make_plots.py" in x)
    assert line.rstrip().endswith("scripts/make_plots.py out/plots/img"), line
    assert subprocess.run(["git", "check-ignore", "-q", "out/plots/img/x.png"], cwd=ROOT).returncode == 0
    asked = subprocess.run(["make", "-n", "plots", "PLOTS_DIR=docs/img"], cwd=ROOT, capture_output=True, text=True)
    assert "scripts/make_plots.py docs/img" in asked.stdout
    source = (ROOT / "scripts" / "make_plots.py").read_text()
    assert 'ROOT / "out" / "plots" / "img"' in source and 'ROOT / "docs" / "img"' not in source
