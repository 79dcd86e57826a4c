"""make train-policy at a small size, end to end: the sim records expert, perturbed and faulty bags (.venv, MuJoCo),
flashrt-train fits them with the Makefile's own SIM_POLICY_TRAIN flags (here, .venv-train, PyTorch), sim.ship
names the channels, and the shipped file drives the arm offline (.venv again: no torch there)."""
from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys

from conftest import ROOT

NODE_VENV = ROOT / ".venv" / "bin"  # the sim's venv: make test-train builds it first (Makefile)
SMALL = {"--steps": "30", "--eval-every": "10", "--window": "32", "--batch": "4"}


def _recipe_flags() -> list[str]:
    """SIM_POLICY_TRAIN from the Makefile, with the run's length and batch cut to SMALL."""
    text = (ROOT / "Makefile").read_text()
    m = re.search(r"^SIM_POLICY_TRAIN := ((?:.*\\\n)*.*)$", text, re.M)
    assert m, "SIM_POLICY_TRAIN not found in the Makefile"
    flags = shlex.split(m.group(1).replace("\\\n", " "))
    for flag, value in SMALL.items():
        assert flag in flags, f"{flag} no longer in the recipe: update SMALL"
        flags[flags.index(flag) + 1] = value
    return flags


def _run(cmd, **kw):
    res = subprocess.run([str(c) for c in cmd], cwd=ROOT, capture_output=True, text=True, timeout=600, **kw)
    assert res.returncode == 0, (cmd, res.stdout[-2000:], res.stderr[-3000:])
    return res


def test_recorded_sim_bags_train_ship_and_drive_the_arm_with_the_makefiles_recipe(tmp_path):
    assert (NODE_VENV / "flashrt-sim").exists(), "make test-train builds .venv (the sim) first"
    bags = tmp_path / "bags"
    bags.mkdir()
    for name, flags in (("expert", ["--seed", "0"]), ("perturbed", ["--seed", "1", "--perturb", "0.05"]),
                        ("faulty", ["--seed", "2", "--faults"])):
        _run([NODE_VENV / "flashrt-sim", "--expert", "--record", tmp_path / name, "--episodes", "2",
              "--seconds", "1.5", *flags])
        for bag in sorted((tmp_path / name).glob("episode_*")):  # the recipe's renaming: one corpus, distinct names
            bag.rename(bags / f"{name}_{bag.name.split('_')[-1]}")
    assert len(list(bags.iterdir())) == 6

    run = tmp_path / "run"
    _run([sys.executable, "-m", "flashrt_ros.train.cli", bags, *_recipe_flags(), "--out", run])
    report = json.loads((run / "report.json").read_text())
    assert report["steps"] == 30 and report["status"] != "interrupted", report

    shipped = tmp_path / "pusher.safetensors"
    ship = _run([NODE_VENV / "python", "-m", "flashrt_ros.sim.ship", run, shipped])
    assert "validation" in ship.stdout.lower(), ship.stdout
    check = _run([NODE_VENV / "python", "-c",
                  "import sys, json; from flashrt_ros.runtime.model.policy_file import read_policy; "
                  "from flashrt_ros.sim.world import OBS_NAMES, ARM_JOINTS; p = read_policy(sys.argv[1]); "
                  "print(json.dumps([list(p.obs_names) == list(OBS_NAMES), list(p.action_names) == list(ARM_JOINTS)]))",
                  shipped])
    assert json.loads(check.stdout) == [True, True]
    rate = _run([NODE_VENV / "flashrt-sim", "--policy", shipped, "--success-rate", "--episodes", "1",
                 "--seconds", "0.5"])
    assert re.search(r"policy success rate: [01]\.\d\d \([01]/1\) over held-out episodes", rate.stdout), rate.stdout
