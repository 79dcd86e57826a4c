"""The machine a benchmark ran on, recorded in its JSON: a number without its machine cannot be compared.

CPU model, cores (all and usable), load average before and after the run, the backend, and the versions
of the numeric stack (numpy, its BLAS, numba, cupy). Versions come from package metadata, so recording
them never imports (or initialises) cupy or numba.
"""
from __future__ import annotations

import importlib.metadata
import os
import platform
import sys
from pathlib import Path


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo on Linux; x86 says `model name`, Arm boards often only `Hardware`
    or nothing), else what platform reports."""
    try:
        for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("model name", "Hardware", "Model") and value.strip():
                return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def load_average() -> list[float] | None:
    """1, 5 and 15 minute load averages (None where the OS has none)."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def package_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def blas_info() -> list[dict]:
    """numpy's BLAS: as threadpoolctl sees it at run time (library, version, threads, kernel) where it is
    installed, else as numpy was built (name, version); empty where neither can tell."""
    import numpy
    try:
        from threadpoolctl import threadpool_info
        return [{k: d.get(k) for k in ("internal_api", "version", "num_threads", "architecture")}
                for d in threadpool_info() if d.get("user_api") == "blas"]
    except ImportError:
        pass
    try:
        blas = numpy.show_config(mode="dicts")["Build Dependencies"]["blas"]
    except Exception:  # numpy < 1.26 has no mode="dicts"; the versions are still recorded
        return []
    return [{"internal_api": blas.get("name"), "version": blas.get("version")}]


def cupy_version() -> str | None:
    for dist in ("cupy", "cupy-cuda12x", "cupy-cuda11x", "cupy-cuda13x"):
        if (v := package_version(dist)) is not None:
            return v
    return None


def machine_info(backend: str | None = None) -> dict:
    """Everything but the load after the run (see `with_machine`)."""
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = os.cpu_count()
    return {"cpu_model": cpu_model(), "arch": platform.machine(), "cores": os.cpu_count(), "cores_usable": usable,
            "backend": backend, "python": sys.version.split()[0], "numpy": package_version("numpy"),
            "blas": blas_info(), "numba": package_version("numba"), "cupy": cupy_version()}


def with_machine(result: dict, backend: str | None, load_before: list[float] | None) -> dict:
    """`result` with a `machine` block: the machine, and the load average before and after the run."""
    info = machine_info(backend)
    info["load_avg_before"], info["load_avg_after"] = load_before, load_average()
    return {**result, "machine": info}
