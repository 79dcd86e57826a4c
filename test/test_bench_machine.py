"""Every benchmark JSON says which machine it came from (issue 19, item 7): the CPU model, the cores, the load
average before and after, the backend and the numeric stack's versions."""
import json
import os

import numpy as np

from flashrt_ros.tools.bench.cli import main as bench_main
from flashrt_ros.tools.machine import machine_info


def test_machine_info_names_this_cpu_its_cores_and_numpy():
    info = machine_info("numpy")
    assert info["cores"] == os.cpu_count() and 1 <= info["cores_usable"] <= info["cores"]
    assert info["cpu_model"] and info["cpu_model"] != "unknown"
    assert info["numpy"] == np.__version__ and info["backend"] == "numpy"
    assert {"blas", "numba", "cupy", "python", "arch"} <= info.keys()


def test_a_bench_json_carries_its_machine_and_the_load_before_and_after(tmp_path, capsys):
    out = tmp_path / "capsules.json"
    assert bench_main(["capsules", "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert json.loads(capsys.readouterr().out) == data  # stdout and the file agree
    m = data["machine"]
    assert m["backend"] == "numpy" and m["cores"] == os.cpu_count()
    for key in ("load_avg_before", "load_avg_after"):
        assert len(m[key]) == 3 and all(x >= 0 for x in m[key])
